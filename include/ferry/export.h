// FERRY_API marks what libferry.so exports: the public classes and functions
// declared in include/ferry/. The library is built with -fvisibility=hidden
// and -fvisibility-inlines-hidden (and a linker version script that keeps
// only ferry:: and ferry_ names: cmake/ferry.map), so everything else stays
// inside it; the static library (libferry.a) is the same code. FERRY_LOCAL
// hides a member of an exported class (a nested class) again.
//
// In C++ the attribute is the standard-syntax [[gnu::visibility]], which
// may follow other attributes (class [[nodiscard]] FERRY_API Status); in C
// (for C headers) GCC's __attribute__.
#ifndef FERRY_EXPORT_H_
#define FERRY_EXPORT_H_

#if defined(__cplusplus) && (defined(__GNUC__) || defined(__clang__))
#define FERRY_API [[gnu::visibility("default")]]
#define FERRY_LOCAL [[gnu::visibility("hidden")]]
#elif defined(__GNUC__) || defined(__clang__)
#define FERRY_API __attribute__((visibility("default")))
#define FERRY_LOCAL __attribute__((visibility("hidden")))
#else
#define FERRY_API
#define FERRY_LOCAL
#endif

#endif  // FERRY_EXPORT_H_
