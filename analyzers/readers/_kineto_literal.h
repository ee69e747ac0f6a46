/* One Kineto time literal -> integer ns: shared by _kineto_times.c and _kineto_fields.c; the
 * contract is kineto_times.py's (int: v * 1000; a decimal of at most 15 characters:
 * nearbyint(strtod(s) * 1000.0), Python's round(float(s) * 1000); a longer one: exact, the
 * fourth decimal rounding half up), within int64; returns 0 where it does not convert. */
#ifndef KINETO_LITERAL_H
#define KINETO_LITERAL_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KINETO_MAX_CHARS 24
#define KINETO_MAX_WHOLE (INT64_MAX / 1000 - 1)

static inline int kineto_literal_ns(const char *s, long n, int64_t *out) {
    if (n <= 0 || n > KINETO_MAX_CHARS || s[0] < '0' || s[0] > '9')
        return 0;
    long dot = -1;
    for (long i = 0; i < n; i++) {
        char c = s[i];
        if (c == '.') {
            if (dot >= 0) return 0;
            dot = i;
        } else if (c < '0' || c > '9') {
            return 0;
        }
    }
    long at = dot < 0 ? n : dot;
    if (dot >= 0 && dot == n - 1) return 0;          /* "12." is no JSON number */
    if (at > 16) return 0;
    int64_t whole = 0;
    for (long i = 0; i < at; i++) whole = whole * 10 + (s[i] - '0');
    if (whole > KINETO_MAX_WHOLE) return 0;
    if (dot < 0) {
        *out = whole * 1000;
        return 1;
    }
    if (n <= 15) {
        char buf[KINETO_MAX_CHARS + 1];
        memcpy(buf, s, (size_t)n);
        buf[n] = 0;
        *out = (int64_t)nearbyint(strtod(buf, NULL) * 1000.0);
        return 1;
    }
    int64_t frac = 0;
    for (long k = 0; k < 3; k++) {
        long i = dot + 1 + k;
        frac = frac * 10 + (i < n ? s[i] - '0' : 0);
    }
    long r = dot + 4;
    *out = whole * 1000 + frac + ((r < n && s[r] >= '5') ? 1 : 0);
    return 1;
}
#endif
