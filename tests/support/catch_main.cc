// Catch2's main, compiled here only for the ThreadSanitizer build (tests/meson.build says why).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
