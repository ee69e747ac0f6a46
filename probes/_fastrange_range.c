/* srtscope.probes._fastrange, part: ThreadState, Range (an enabled range, recorder only) and stage()
 * (see _fastrange.h, _fastrange.c). */
#include "_fastrange.h"

/* ---- ThreadState: native tid + nesting depth of one thread ------------------------------- */

static int
ts_add_depth(ThreadState *ts, Py_ssize_t delta)
{
    Py_ssize_t d = PyLong_AsSsize_t(ts->depth);
    if (d == -1 && PyErr_Occurred())
        return -1;
    PyObject *nd = PyLong_FromSsize_t(d + delta);
    if (nd == NULL)
        return -1;
    Py_SETREF(ts->depth, nd);
    return 0;
}

static void
ts_dealloc(ThreadState *self)
{
    Py_XDECREF(self->tid);
    Py_XDECREF(self->depth);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef ts_members[] = {
    {"tid", T_OBJECT_EX, offsetof(ThreadState, tid), READONLY, "native thread id"},
    {"depth", T_OBJECT_EX, offsetof(ThreadState, depth), 0, "ranges open on this thread"},
    {NULL}
};

PyTypeObject ThreadStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "srtscope.probes._fastrange.ThreadState",
    .tp_basicsize = sizeof(ThreadState),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)ts_dealloc,
    .tp_members = ts_members,
    .tp_doc = "Per-thread probe state: native tid and nesting depth.",
};

/* The calling thread's ThreadState (borrowed), created on first use. */
ThreadState *
thread_state_get(void)
{
    PyObject *d = PyThreadState_GetDict();
    if (d == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no thread state dict");
        return NULL;
    }
    PyObject *s = PyDict_GetItemWithError(d, tls_key);
    if (s != NULL)
        return (ThreadState *)s;
    if (PyErr_Occurred())
        return NULL;
    ThreadState *ts = PyObject_New(ThreadState, &ThreadStateType);
    if (ts == NULL)
        return NULL;
    ts->depth = PyLong_FromLong(0);
    ts->tid = PyLong_FromUnsignedLong(PyThread_get_thread_native_id());
    if (ts->tid == NULL || ts->depth == NULL || PyDict_SetItem(d, tls_key, (PyObject *)ts) < 0) {
        Py_DECREF(ts);
        return NULL;
    }
    Py_DECREF(ts);   /* the dict holds it for the thread's life */
    return ts;
}

/* ---- Range: an enabled range, recorder only ------------------------------------------------ */

typedef struct Range {
    PyObject_HEAD
    PyObject *name;
    PyObject *attrs;     /* dict or NULL (none yet) */
    ThreadState *ts;     /* set by __enter__ */
    long long t0;        /* ns, CLOCK_MONOTONIC */
} Range;

static int
range_traverse(Range *self, visitproc visit, void *arg)
{
    Py_VISIT(self->attrs);
    return 0;
}

static int
range_clear(Range *self)
{
    Py_CLEAR(self->attrs);
    return 0;
}

/* NOTE: freed Ranges are kept for reuse (at most FREE_MAX, each untracked and emptied): a range
 * lives for one `with`, and the allocator's round trip was a tenth of its cost */
#define FREE_MAX 64
static Range *free_ranges[FREE_MAX];
static int n_free = 0;

static void
range_dealloc(Range *self)
{
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->name);
    Py_CLEAR(self->attrs);
    Py_CLEAR(self->ts);
    if (n_free < FREE_MAX && Py_TYPE(self) == &RangeType)
        free_ranges[n_free++] = self;
    else
        Py_TYPE(self)->tp_free((PyObject *)self);
}

PyObject *
range_enter(Range *self, PyObject *const *args, Py_ssize_t nargs)
{
    ThreadState *ts = thread_state_get();
    if (ts == NULL)
        return NULL;
    if (ts_add_depth(ts, 1) < 0)
        return NULL;
    Py_INCREF(ts);
    Py_XSETREF(self->ts, ts);
    self->t0 = clock_ns();
    Py_INCREF(self);
    return (PyObject *)self;
}

PyObject *
range_exit(Range *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long t1 = clock_ns();
    ThreadState *ts = self->ts;
    if (ts == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "range exited without being entered");
        return NULL;
    }
    if (ts_add_depth(ts, -1) < 0)
        return NULL;
    PyObject *item[6];
    item[0] = Py_NewRef(self->name);
    item[1] = PyLong_FromLongLong(self->t0);
    item[2] = PyLong_FromLongLong(t1);
    item[3] = Py_NewRef(ts->tid);
    item[4] = Py_NewRef(ts->depth);
    item[5] = (self->attrs != NULL && PyDict_GET_SIZE(self->attrs)) ? Py_NewRef(self->attrs) : Py_NewRef(Py_None);
    PyObject *out = NULL, *spans = NULL;
    if (item[1] == NULL || item[2] == NULL || item[4] == NULL)
        goto done;
    /* NOTE: the recorder and its list are looked up now, not cached: set_recorder() swaps the
     * recorder and Recorder.clear() swaps the list */
    PyObject *rec = recorder_ns ? PyDict_GetItemWithError(recorder_ns, str_default) : NULL;
    if (rec == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "recorder module has no _DEFAULT");
        goto done;
    }
    spans = PyObject_GetAttr(rec, str_spans);
    if (spans == NULL)
        goto done;
    if (PyList_CheckExact(spans)) {
        /* NOTE: one span = 6 appends with no Python code in between (all objects exist already,
         * appends only grow the list): atomic under the GIL as the Python path's one extend.
         * On a failed append the list is cut back, so a reader never sees part of a span. */
        Py_ssize_t n = PyList_GET_SIZE(spans);
        for (int i = 0; i < 6; i++) {
            if (PyList_Append(spans, item[i]) < 0) {
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                PyList_SetSlice(spans, n, PY_SSIZE_T_MAX, NULL);
                PyErr_Restore(type, value, tb);
                goto done;
            }
        }
    }
    else {
        PyObject *tuple = PyTuple_New(6);
        if (tuple == NULL)
            goto done;
        for (int i = 0; i < 6; i++)
            PyTuple_SET_ITEM(tuple, i, Py_NewRef(item[i]));
        PyObject *r = PyObject_CallMethodOneArg(spans, str_extend, tuple);
        Py_DECREF(tuple);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(spans);
    for (int i = 0; i < 6; i++)
        Py_XDECREF(item[i]);
    return out;
}

static PyObject *
range_set(Range *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs) {
        PyErr_SetString(PyExc_TypeError, "set() takes keyword arguments only");
        return NULL;
    }
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nkw == 0)
        Py_RETURN_NONE;
    if (self->attrs == NULL)
        return (self->attrs = kw_dict(args, kwnames)) ? Py_NewRef(Py_None) : NULL;
    for (Py_ssize_t i = 0; i < nkw; i++)
        if (PyDict_SetItem(self->attrs, PyTuple_GET_ITEM(kwnames, i), args[i]) < 0)
            return NULL;
    Py_RETURN_NONE;
}

static PyObject *
range_get_attrs(Range *self, void *Py_UNUSED(closure))
{
    if (self->attrs == NULL && (self->attrs = PyDict_New()) == NULL)
        return NULL;
    return Py_NewRef(self->attrs);
}

static PyObject *
range_call(Range *self, PyObject *args, PyObject *kwargs)
{
    PyObject *attrs = self->attrs ? PyDict_Copy(self->attrs) : PyDict_New();
    if (attrs == NULL)
        return NULL;
    PyObject *out = decorate(self->name, attrs, args, kwargs);
    Py_DECREF(attrs);
    return out;
}

static PyMethodDef range_methods[] = {
    {"set", (PyCFunction)(void (*)(void))range_set, METH_FASTCALL | METH_KEYWORDS,
     "Add attributes, recorded at exit."},
    {NULL}
};

static PyMemberDef range_members[] = {
    {"name", T_OBJECT_EX, offsetof(Range, name), READONLY, NULL},
    {NULL}
};

static PyGetSetDef range_getset[] = {
    {"attrs", (getter)range_get_attrs, NULL, NULL, NULL},
    {NULL}
};

PyTypeObject RangeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "srtscope.probes._fastrange.Range",
    .tp_basicsize = sizeof(Range),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)range_dealloc,
    .tp_traverse = (traverseproc)range_traverse,
    .tp_clear = (inquiry)range_clear,
    .tp_call = (ternaryfunc)range_call,
    .tp_methods = range_methods,
    .tp_members = range_members,
    .tp_getset = range_getset,
    .tp_doc = "Enabled range, recorder only: a span (name, t0_ns, t1_ns, tid, depth, attrs) at exit.",
};

/* ---- stage(): the module's entry point, by mode ------------------------------------------- */

PyObject *
stage(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (mode == MODE_PYTHON || nargs != 1) {   /* odd shapes (name=...) get Python's answer */
        if (py_stage == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "_fastrange is not bound (ranges.py binds it)");
            return NULL;
        }
        return PyObject_Vectorcall(py_stage, args, nargs, kwnames);
    }
    PyObject *name = args[0];
    int has_kw = kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0;
    if (mode == MODE_OFF) {
        if (has_kw)
            return null_new(name, args + 1, kwnames);
        PyObject *n = PyDict_GetItemWithError(nulls, name);
        if (n != NULL)
            return Py_NewRef(n);
        if (PyErr_Occurred() || (n = null_new(name, NULL, NULL)) == NULL)
            return NULL;
        if (PyDict_SetItem(nulls, name, n) < 0) {
            Py_DECREF(n);
            return NULL;
        }
        return n;
    }
    Range *r;
    if (n_free > 0) {
        r = free_ranges[--n_free];
        PyObject_Init((PyObject *)r, &RangeType);   /* refcount 1 again */
    }
    else if ((r = PyObject_GC_New(Range, &RangeType)) == NULL)
        return NULL;
    r->name = Py_NewRef(name);
    r->ts = NULL;
    r->t0 = 0;
    r->attrs = NULL;
    if (has_kw && (r->attrs = kw_dict(args + 1, kwnames)) == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    PyObject_GC_Track(r);
    return (PyObject *)r;
}
