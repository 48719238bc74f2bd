// check.h — the C++ tests' one assertion: a failed check prints where and what, and counts into
// `counter`, so a run reports every failure instead of stopping at the first.
#ifndef DUALEMB_TESTS_CHECK_H_
#define DUALEMB_TESTS_CHECK_H_

#include <cstdio>

#define DE_TEST_CHECK(counter, cond)                                                \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++(counter);                                                                  \
    }                                                                               \
  } while (0)

#endif  // DUALEMB_TESTS_CHECK_H_
