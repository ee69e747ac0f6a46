/* The members of a batch of Kineto events (msgspec structs, kineto_stream.Event) in one pass:
 * the C side of kineto_columns._fields (same contract, see there).
 *
 * fields(events, unset, x, ts, ts_state, dur, dur_state) -> (cats, names, pids, tids)
 *   x[i]        1 where ph is the string "X"
 *   ts / dur    ns of the raw literal (_kineto_literal.h); *_state 0: absent (unset) or not a
 *               buffer, 1: converted, 2: a literal to decode one by one
 *   the lists   cat, name, pid, tid of every event as they are (unset where absent)
 * Each struct is touched once, where a pass per member touches it once a member.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_kineto_literal.h"

static PyObject *s_ph, *s_cat, *s_name, *s_pid, *s_tid, *s_ts, *s_dur, *s_X;

static void time_of(PyObject *v, PyObject *unset, int64_t *ns, uint8_t *st) {
    *ns = 0;
    *st = 0;
    if (v == unset || !PyObject_CheckBuffer(v))
        return;
    Py_buffer b;
    if (PyObject_GetBuffer(v, &b, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return;
    }
    *st = kineto_literal_ns((const char *)b.buf, (long)b.len, ns) ? 1 : 2;
    PyBuffer_Release(&b);
}

static PyObject *fields(PyObject *self, PyObject *args) {
    PyObject *evs, *unset;
    Py_buffer xb, tsb, tstb, db, dstb;
    if (!PyArg_ParseTuple(args, "O!Ow*w*w*w*w*", &PyList_Type, &evs, &unset, &xb, &tsb, &tstb, &db, &dstb))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(evs);
    PyObject *out = NULL, *lists[4] = {NULL, NULL, NULL, NULL};
    PyObject *names[4] = {s_cat, s_name, s_pid, s_tid};
    if (xb.len < n || tstb.len < n || dstb.len < n || tsb.len < n * 8 || db.len < n * 8) {
        PyErr_SetString(PyExc_ValueError, "output buffers shorter than the list");
        goto done;
    }
    for (int k = 0; k < 4; k++)
        if (!(lists[k] = PyList_New(n))) goto done;
    uint8_t *x = xb.buf, *tst = tstb.buf, *dst = dstb.buf;
    int64_t *ts = tsb.buf, *du = db.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(evs, i);
        PyObject *ph = PyObject_GetAttr(e, s_ph);
        if (!ph) goto done;
        x[i] = PyUnicode_Check(ph) && PyUnicode_Compare(ph, s_X) == 0;
        Py_DECREF(ph);
        for (int k = 0; k < 4; k++) {
            PyObject *v = PyObject_GetAttr(e, names[k]);
            if (!v) goto done;
            PyList_SET_ITEM(lists[k], i, v);        /* the new reference goes to the list */
        }
        PyObject *t = PyObject_GetAttr(e, s_ts);
        if (!t) goto done;
        time_of(t, unset, &ts[i], &tst[i]);
        Py_DECREF(t);
        PyObject *d = PyObject_GetAttr(e, s_dur);
        if (!d) goto done;
        time_of(d, unset, &du[i], &dst[i]);
        Py_DECREF(d);
    }
    out = PyTuple_Pack(4, lists[0], lists[1], lists[2], lists[3]);
done:
    for (int k = 0; k < 4; k++) Py_XDECREF(lists[k]);
    PyBuffer_Release(&xb);
    PyBuffer_Release(&tsb);
    PyBuffer_Release(&tstb);
    PyBuffer_Release(&db);
    PyBuffer_Release(&dstb);
    return out;
}

static PyMethodDef methods[] = {
    {"fields", fields, METH_VARARGS,
     "fields(events, unset, x, ts, ts_state, dur, dur_state) -> (cats, names, pids, tids)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kineto_fields", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kineto_fields(void) {
    s_ph = PyUnicode_InternFromString("ph");
    s_cat = PyUnicode_InternFromString("cat");
    s_name = PyUnicode_InternFromString("name");
    s_pid = PyUnicode_InternFromString("pid");
    s_tid = PyUnicode_InternFromString("tid");
    s_ts = PyUnicode_InternFromString("ts");
    s_dur = PyUnicode_InternFromString("dur");
    s_X = PyUnicode_InternFromString("X");
    if (!s_ph || !s_cat || !s_name || !s_pid || !s_tid || !s_ts || !s_dur || !s_X)
        return NULL;
    return PyModule_Create(&module);
}
