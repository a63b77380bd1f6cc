/* The reference backend against the independent oracle (tests/support/grid.c) on every case of
 * the shared grid, and the grid harness's own ability to fail. */
#include "grid.h"
#include "test.h"

int main(void)
{
    int n = grid_count();
    CHECK(n > 80);
    for (int i = 0; i < n; i++) {
        grid_result r;
        int failed = grid_check_reference(i, &r);
        test__checks++;
        if (failed) TEST_FAIL("case %d %s: %s", i, grid_case_name(i), r.reason);
    }
    /* The reference against itself through the full harness (poison, canaries, cache compare):
     * proves the harness passes a correct backend. */
    const pa_backend *ref = pa_backend_find("reference");
    CHECK(ref != NULL);
    for (int i = 0; i < n; i += 7) {
        grid_result r;
        CHECK_INT(grid_run_case(ref, i, 1, &r), 0);
        CHECK_INT(r.skipped, 0);
    }
    return test_exit();
}
