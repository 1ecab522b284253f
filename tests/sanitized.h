// Whether this test binary is built with ASan (kAddressSanitized) or TSan (kThreadSanitized); g++
// defines __SANITIZE_*__, clang has __has_feature. Tests size fixed work to the build's speed with
// them, or skip what a sanitizer's runtime changes (its allocator keeps freed memory its own way).
#ifndef CONNEX_TESTS_SANITIZED_H_
#define CONNEX_TESTS_SANITIZED_H_

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitized = true;
#else
constexpr bool kAddressSanitized = false;
#endif
#else
constexpr bool kAddressSanitized = false;
#endif

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitized = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitized = true;
#else
constexpr bool kThreadSanitized = false;
#endif
#else
constexpr bool kThreadSanitized = false;
#endif

constexpr bool kSanitized = kAddressSanitized || kThreadSanitized;

#endif  // CONNEX_TESTS_SANITIZED_H_
