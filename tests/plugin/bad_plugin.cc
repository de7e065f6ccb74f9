// Plugins the loader must refuse, one per define (tests/plugin/meson.build builds each):
//   BAD_NO_SYMBOL  exports no weftBackendPlugin_vN at all
//   BAD_FUTURE     exports only weftBackendPlugin_v3, a version this weft does not know
//   BAD_SIZE       exports weftBackendPlugin_v1 with a struct_size from another plugin.h
//   BAD_GONE_DEP   a good v1 struct, but the library needs libweft_test_gone.so, which is not on
//                  any search path at run time (dlopen fails)
#include "weft/plugin.h"

namespace {
[[maybe_unused]] weft_result_t init(const weftInitArgs_v1_t*, void**, char*, size_t) {
  return WEFT_ERR_INTERNAL;
}
[[maybe_unused]] weft_result_t post(void*, const weftCollective_v1_t*, uint32_t, weftDone_v1_t,
                                    void*, void**, char*, size_t) {
  return WEFT_ERR_INTERNAL;
}
[[maybe_unused]] void abort_context(void*, const char*) {}
[[maybe_unused]] void finalize(void*) {}
}  // namespace

#ifdef BAD_GONE_DEP
extern "C" int weft_test_gone(void);
extern "C" __attribute__((visibility("default"))) int bad_plugin_uses_gone() {
  return weft_test_gone();
}
#endif

extern "C" {

#if defined(BAD_NO_SYMBOL)
__attribute__((visibility("default"))) extern const int not_a_weft_plugin;
const int not_a_weft_plugin = 1;
#elif defined(BAD_FUTURE)
// What a v3 plugin might export: weft only looks at the symbol's name.
__attribute__((visibility("default"))) extern const weftBackendPlugin_v1_t weftBackendPlugin_v3;
const weftBackendPlugin_v1_t weftBackendPlugin_v3 = {"future",
                                                     3,
                                                     sizeof(weftBackendPlugin_v1_t) + 16,
                                                     1u << WEFT_DEVICE_CPU,
                                                     0,
                                                     init,
                                                     post,
                                                     nullptr,
                                                     nullptr,
                                                     abort_context,
                                                     finalize};
#else
__attribute__((visibility("default"))) extern const weftBackendPlugin_v1_t weftBackendPlugin_v1;
const weftBackendPlugin_v1_t weftBackendPlugin_v1 = {
#if defined(BAD_SIZE)
    "badsize",
    1,
    sizeof(weftBackendPlugin_v1_t) - 8,
#else
    "gonedep",
    1,
    sizeof(weftBackendPlugin_v1_t),
#endif
    1u << WEFT_DEVICE_CPU,
    0,
    init,
    post,
    nullptr,
    nullptr,
    abort_context,
    finalize};
#endif

}  // extern "C"
