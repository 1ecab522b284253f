// kSanitized: whether this test binary is built with ASan or TSan (g++ defines __SANITIZE_*__,
// clang has __has_feature). Tests size fixed work to the build's speed with it, or skip what a
// sanitizer's runtime changes (its allocator keeps freed memory its own way).
#ifndef CONNEX_TESTS_SANITIZED_H_
#define CONNEX_TESTS_SANITIZED_H_

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

#endif  // CONNEX_TESTS_SANITIZED_H_
