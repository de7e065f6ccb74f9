// A library that exists only at link time: tests/plugin/meson.build links the gonedep plugin
// against it without an rpath, so that loading the plugin fails with dlopen's message.
extern "C" __attribute__((visibility("default"))) int weft_test_gone(void) { return 42; }
