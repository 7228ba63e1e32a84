/*
 * Long double arithmetic for INCRBYFLOAT and HINCRBYFLOAT.
 *
 * Redis computes these increments in C `long double` (the x87 80-bit format on x86-64)
 * and prints the sum with "%.17Lf", so the only way to answer byte for byte as it does
 * is to do the same arithmetic and the same printing through the C library. The Rust
 * side (src/types/longdouble.rs) is the only caller.
 */

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Inputs of this many bytes or more are refused, as Redis refuses them. */
#define KITE_LD_MAX_CHARS 5120

/* Error codes of kite_ld_add (a successful call returns the output length, >= 0). */
#define KITE_LD_BAD_FIRST (-1)
#define KITE_LD_BAD_SECOND (-2)
#define KITE_LD_NOT_FINITE (-3)
#define KITE_LD_NO_ROOM (-4)

/*
 * Reads the whole of s[0..len) as a long double. Refuses: empty input, input too long,
 * leading white space, anything left over (including an embedded NUL), overflow to
 * infinity, underflow to zero, and NaN. "inf", hexadecimal and exponent forms are what
 * strtold makes of them.
 */
static int kite_ld_read(const char *s, size_t len, long double *out)
{
    char buf[KITE_LD_MAX_CHARS];
    char *end = NULL;
    long double v;

    if (len == 0 || len >= sizeof(buf))
        return 0;
    memcpy(buf, s, len);
    buf[len] = '\0';
    if (isspace((unsigned char)buf[0]))
        return 0;
    errno = 0;
    v = strtold(buf, &end);
    if (end != buf + len)
        return 0;
    if (errno == EINVAL)
        return 0;
    if (errno == ERANGE && (isinf(v) || v == 0.0L))
        return 0;
    if (isnan(v))
        return 0;
    *out = v;
    return 1;
}

/*
 * Prints v with 17 decimals, then drops trailing zeros of the fraction and a dangling
 * point; a result reading "-0" becomes "0". Returns the length, or KITE_LD_NO_ROOM.
 */
static long kite_ld_print(long double v, char *out, size_t outlen)
{
    int n = snprintf(out, outlen, "%.17Lf", v);
    size_t len;

    if (n < 0 || (size_t)n >= outlen)
        return KITE_LD_NO_ROOM;
    len = (size_t)n;
    if (memchr(out, '.', len) != NULL) {
        while (len > 0 && out[len - 1] == '0')
            len--;
        if (len > 0 && out[len - 1] == '.')
            len--;
    }
    if (len == 2 && out[0] == '-' && out[1] == '0') {
        out[0] = '0';
        len = 1;
    }
    return (long)len;
}

/* 1 when s[0..len) reads as a long double by the rules above. */
int kite_ld_valid(const char *s, size_t len)
{
    long double v;
    return kite_ld_read(s, len, &v);
}

/*
 * Reads a and b, adds them in long double and prints the sum into out. Returns the
 * length written (no terminator counted) or one of the negative codes above.
 */
long kite_ld_add(const char *a, size_t alen, const char *b, size_t blen, char *out,
                 size_t outlen)
{
    long double x, y, sum;

    if (!kite_ld_read(a, alen, &x))
        return KITE_LD_BAD_FIRST;
    if (!kite_ld_read(b, blen, &y))
        return KITE_LD_BAD_SECOND;
    sum = x + y;
    if (isnan(sum) || isinf(sum))
        return KITE_LD_NOT_FINITE;
    return kite_ld_print(sum, out, outlen);
}
