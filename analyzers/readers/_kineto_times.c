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
#include "_kineto_literal.h"

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
        if (kineto_literal_ns((const char *)b.buf, (long)b.len, &v)) {
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
