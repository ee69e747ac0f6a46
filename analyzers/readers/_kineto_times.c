/* Kineto time literals -> integer ns: the C side of kineto_times.py (same contract, see there).
 *
 * literals_ns(raws, ns, ok): raws a list of bytes-like raw JSON literals (or anything else: not
 * converted); ns a writable int64 buffer and ok a writable uint8 buffer of len(raws) each. For each
 * literal that is an unsigned int (whole part at most 16 digits) or a decimal without exponent:
 *   int:                  v * 1000
 *   float, <= 15 chars:   nearbyint(strtod(s) * 1000.0)  -- Python's round(float(s) * 1000): both
 *                         correctly rounded parses, half-to-even rounding (the default mode)
 *   float, longer:        whole * 1000 + first three decimals, + 1 when the fourth is >= '5'
 * with the ns within int64; ok[i] = 1 there, else ok[i] = 0 and ns[i] = 0.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CHARS 24
#define MAX_WHOLE (INT64_MAX / 1000 - 1)

static int convert(const char *s, Py_ssize_t n, int64_t *out) {
    if (n <= 0 || n > MAX_CHARS || s[0] < '0' || s[0] > '9')
        return 0;
    Py_ssize_t dot = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '.') {
            if (dot >= 0) return 0;
            dot = i;
        } else if (c < '0' || c > '9') {
            return 0;
        }
    }
    Py_ssize_t at = dot < 0 ? n : dot;
    if (dot >= 0 && dot == n - 1) return 0;          /* "12." is no JSON number */
    if (at > 16) return 0;
    int64_t whole = 0;
    for (Py_ssize_t i = 0; i < at; i++) whole = whole * 10 + (s[i] - '0');
    if (whole > MAX_WHOLE) return 0;
    if (dot < 0) {
        *out = whole * 1000;
        return 1;
    }
    if (n <= 15) {
        char buf[MAX_CHARS + 1];
        memcpy(buf, s, (size_t)n);
        buf[n] = 0;
        double v = strtod(buf, NULL);
        *out = (int64_t)nearbyint(v * 1000.0);
        return 1;
    }
    int64_t frac = 0;
    Py_ssize_t k;
    for (k = 0; k < 3; k++) {
        Py_ssize_t i = dot + 1 + k;
        frac = frac * 10 + (i < n ? s[i] - '0' : 0);
    }
    Py_ssize_t r = dot + 4;
    *out = whole * 1000 + frac + ((r < n && s[r] >= '5') ? 1 : 0);
    return 1;
}

static PyObject *literals_ns(PyObject *self, PyObject *args) {
    PyObject *raws;
    Py_buffer nsb, okb;
    if (!PyArg_ParseTuple(args, "O!w*w*", &PyList_Type, &raws, &nsb, &okb))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(raws);
    if (nsb.len < n * (Py_ssize_t)sizeof(int64_t) || okb.len < n) {
        PyBuffer_Release(&nsb);
        PyBuffer_Release(&okb);
        PyErr_SetString(PyExc_ValueError, "output buffers shorter than the list");
        return NULL;
    }
    int64_t *ns = (int64_t *)nsb.buf;
    uint8_t *ok = (uint8_t *)okb.buf;
    Py_ssize_t good = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(raws, i);
        ns[i] = 0;
        ok[i] = 0;
        if (!PyObject_CheckBuffer(o))
            continue;
        Py_buffer b;
        if (PyObject_GetBuffer(o, &b, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            continue;
        }
        int64_t v;
        if (convert((const char *)b.buf, b.len, &v)) {
            ns[i] = v;
            ok[i] = 1;
            good++;
        }
        PyBuffer_Release(&b);
    }
    PyBuffer_Release(&nsb);
    PyBuffer_Release(&okb);
    return PyLong_FromSsize_t(good);
}

static PyMethodDef methods[] = {
    {"literals_ns", literals_ns, METH_VARARGS,
     "literals_ns(raws: list, ns: int64 buffer, ok: uint8 buffer) -> count converted"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kineto_times", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kineto_times(void) { return PyModule_Create(&module); }
