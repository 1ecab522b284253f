// Whether this test binary is built with ASan (kAddressSanitized) or TSan (kThreadSanitized); g++
// defines __SANITIZE_*__, clang has __has_feature. Tests size fixed work to the build's speed with
// them, or skip what a sanitizer's runtime changes (its allocator keeps freed memory its own way).
#ifndef CONNEX_TESTS_SANITIZED_H_
#define CONNEX_TESTS_SANITIZED_H_

#if defined(__has_feature)
#define CONNEX_TESTS_HAS_FEATURE(x) __has_feature(x)
#else
#define CONNEX_TESTS_HAS_FEATURE(x) 0
#endif

#if defined(__SANITIZE_ADDRESS__) || CONNEX_TESTS_HAS_FEATURE(address_sanitizer)
constexpr bool kAddressSanitized = true;
#else
constexpr bool kAddressSanitized = false;
#endif

#if defined(__SANITIZE_THREAD__) || CONNEX_TESTS_HAS_FEATURE(thread_sanitizer)
constexpr bool kThreadSanitized = true;
#else
constexpr bool kThreadSanitized = false;
#endif

constexpr bool kSanitized = kAddressSanitized || kThreadSanitized;

#endif  // CONNEX_TESTS_SANITIZED_H_
