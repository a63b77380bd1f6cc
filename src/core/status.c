/* status.c: status names and messages from PA_STATUS_LIST, and the per-thread reason text. */
#include "internal.h"

#include <stdio.h>

static _Thread_local char pa__reason[PA__REASON_MAX];

const char *pa_status_name(pa_status status)
{
    switch (status) {
#define PA__NAME(name, value, msg) \
    case PA_STATUS_##name: return "PA_STATUS_" #name;
        PA_STATUS_LIST(PA__NAME)
#undef PA__NAME
    }
    return "PA_STATUS_UNKNOWN";
}

const char *pa_strerror(pa_status status)
{
    switch (status) {
#define PA__MSG(name, value, msg) \
    case PA_STATUS_##name: return msg;
        PA_STATUS_LIST(PA__MSG)
#undef PA__MSG
    }
    return "unknown status";
}

const char *pa_last_error(void) { return pa__reason; }

void pa__clear_error(void) { pa__reason[0] = '\0'; }

pa_status pa__fail(pa_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pa__reason, sizeof pa__reason, fmt, ap);
    va_end(ap);
    return status;
}

int pa_version_number(void) { return PAGEDATTN_VERSION_NUMBER; }
const char *pa_version_string(void) { return PAGEDATTN_VERSION_STRING; }
