/* test.h: a small assertion kit for pagedattn's C tests. Asserts never compile out, print both
 * sides and the location, and count failures; a test program returns test_exit(). */
#ifndef PAGEDATTN_TEST_H
#define PAGEDATTN_TEST_H

#include "pagedattn.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test__failures;
static int test__checks;

#define TEST_FAIL(...)                                                                       \
    do {                                                                                     \
        test__failures++;                                                                    \
        fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                                \
        fprintf(stderr, __VA_ARGS__);                                                        \
        fputc('\n', stderr);                                                                 \
    } while (0)

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        test__checks++;                                                                      \
        if (!(cond)) TEST_FAIL("%s", #cond);                                                 \
    } while (0)

#define CHECK_INT(a, b)                                                                      \
    do {                                                                                     \
        long long test__a = (long long)(a), test__b = (long long)(b);                        \
        test__checks++;                                                                      \
        if (test__a != test__b) TEST_FAIL("%s == %s: %lld != %lld", #a, #b, test__a, test__b); \
    } while (0)

/* A status check that prints the library's reason on mismatch. */
#define CHECK_STATUS(expr, want)                                                             \
    do {                                                                                     \
        pa_status test__s = (expr);                                                          \
        test__checks++;                                                                      \
        if (test__s != (want))                                                               \
            TEST_FAIL("%s: got %s, want %s (reason: %s)", #expr, pa_status_name(test__s),     \
                      pa_status_name(want), pa_last_error());                                \
    } while (0)
#define CHECK_OK(expr) CHECK_STATUS(expr, PA_STATUS_OK)

/* Status `want` and a reason text that contains `needle`. */
#define CHECK_FAILS_WITH(expr, want, needle)                                                 \
    do {                                                                                     \
        pa_status test__s = (expr);                                                          \
        test__checks++;                                                                      \
        if (test__s != (want))                                                               \
            TEST_FAIL("%s: got %s, want %s (reason: %s)", #expr, pa_status_name(test__s),     \
                      pa_status_name(want), pa_last_error());                                \
        else if (!strstr(pa_last_error(), (needle)))                                         \
            TEST_FAIL("%s: reason \"%s\" lacks \"%s\"", #expr, pa_last_error(), (needle));     \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                \
    do {                                                                                     \
        double test__a = (a), test__b = (b);                                                 \
        test__checks++;                                                                      \
        if (!(fabs(test__a - test__b) <= (tol)))                                             \
            TEST_FAIL("%s ~= %s: %.9g vs %.9g (tol %g)", #a, #b, test__a, test__b, (double)(tol)); \
    } while (0)

static inline int test_exit(void)
{
    if (test__checks == 0) {
        fprintf(stderr, "FAIL: no checks ran\n");
        return 1;
    }
    printf("%d checks, %d failures\n", test__checks, test__failures);
    return test__failures ? 1 : 0;
}

#endif
