/* The C hot path of srtscope.probes.ranges.stage(): see ranges.py for the semantics it mirrors.
 *
 * stage(name, **attrs) by mode (set by ranges.py whenever its _STATE changes):
 *   MODE_OFF     a cached null range per name (a new null carrying attrs when there are any)
 *   MODE_FAST    a Range: __enter__ reads CLOCK_MONOTONIC, __exit__ reads it again and extends the
 *                current recorder's _spans by (name, t0_ns, t1_ns, tid, depth, attrs-or-None)
 *   MODE_PYTHON  the Python stage() (NVTX on, torch annotations on, or the pure path forced)
 *
 * Times are integer ns of CLOCK_MONOTONIC, the clock of time.perf_counter_ns() on Linux.
 * Per-thread state (native tid, nesting depth) is one ThreadState object per Python thread, kept
 * in the thread state dict; the Python path uses the same object, so both count one depth.
 *
 * The parts (one extension; _fastrange.h declares what they share): this file (module state, the
 * helpers of both range kinds, module functions, init), _fastrange_method.c (FastMethod and
 * BoundMethod), _fastrange_null.c (NullRange) and _fastrange_range.c (ThreadState, Range, stage()).
 *
 * NOTE: single-phase init with static state: one interpreter per process, as the package assumes.
 */
#include "_fastrange.h"

int mode = MODE_OFF;
PyObject *py_stage = NULL;      /* ranges._py_stage: MODE_PYTHON, and odd call shapes */
PyObject *decorator = NULL;     /* ranges._Decorator: decorator(name, attrs)(fn) */
PyObject *recorder_ns = NULL;   /* the recorder module's __dict__ (its _DEFAULT changes) */
PyObject *nulls = NULL;         /* name -> cached Null */
PyObject *str_default = NULL;   /* "_DEFAULT" */
PyObject *str_spans = NULL;     /* "_spans" */
PyObject *str_extend = NULL;    /* "extend" */
PyObject *tls_key = NULL;       /* key of the ThreadState in each thread state dict */

/* ---- helpers of both range kinds --------------------------------------------------------- */

/* attrs dict from a vectorcall's keyword names and values */
PyObject *
kw_dict(PyObject *const *values, PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(kwnames, i), values[i]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

/* decorator(name, attrs)(fn): the Python decorator, which checks `enabled` at each call */
PyObject *
decorate(PyObject *name, PyObject *attrs, PyObject *args, PyObject *kwargs)
{
    if (decorator == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_fastrange is not bound (ranges.py binds it)");
        return NULL;
    }
    PyObject *deco = PyObject_CallFunctionObjArgs(decorator, name, attrs, NULL);
    if (deco == NULL)
        return NULL;
    PyObject *out = PyObject_Call(deco, args, kwargs);
    Py_DECREF(deco);
    return out;
}

/* ---- module functions ------------------------------------------------------------------------ */

static PyObject *
set_mode(PyObject *module, PyObject *arg)
{
    long m = PyLong_AsLong(arg);
    if (m == -1 && PyErr_Occurred())
        return NULL;
    if (m < MODE_OFF || m > MODE_PYTHON) {
        PyErr_SetString(PyExc_ValueError, "mode is 0 (off), 1 (fast) or 2 (python)");
        return NULL;
    }
    mode = (int)m;
    Py_RETURN_NONE;
}

static PyObject *
get_mode(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(mode);
}

static PyObject *
bind(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "bind(recorder_module_dict, py_stage, decorator)");
        return NULL;
    }
    Py_XSETREF(recorder_ns, Py_NewRef(args[0]));
    Py_XSETREF(py_stage, Py_NewRef(args[1]));
    Py_XSETREF(decorator, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

static PyObject *
thread_state(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ThreadState *ts = thread_state_get();
    return ts ? Py_NewRef((PyObject *)ts) : NULL;
}

static PyObject *
py_clock_ns(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(clock_ns());
}

static PyMethodDef module_methods[] = {
    {"stage", (PyCFunction)(void (*)(void))stage, METH_FASTCALL | METH_KEYWORDS,
     "stage(name, **attrs)\n--\n\n"
     "A probe range named after a taxonomy stage (see srtscope.probes.stages): `with stage(...)`\n"
     "or `@stage(...)`; attribute values should be scalars. The C hot path of ranges.stage()."},
    {"set_mode", set_mode, METH_O, "0: disabled, 1: recorder-only fast path, 2: delegate to Python."},
    {"get_mode", get_mode, METH_NOARGS, "The current mode."},
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(recorder_module_dict, py_stage, decorator): what the C path calls back into."},
    {"thread_state", thread_state, METH_NOARGS, "The calling thread's ThreadState (tid, depth)."},
    {"clock_ns", py_clock_ns, METH_NOARGS, "CLOCK_MONOTONIC in integer ns (= time.perf_counter_ns on Linux)."},
    {NULL}
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_fastrange", "C hot path of srtscope.probes.ranges.stage().", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__fastrange(void)
{
    if (PyType_Ready(&ThreadStateType) < 0 || PyType_Ready(&NullType) < 0 || PyType_Ready(&RangeType) < 0
        || PyType_Ready(&FastMethodType) < 0 || PyType_Ready(&BoundType) < 0)
        return NULL;
    if (PyDict_GetItemString(RangeType.tp_dict, "__exit__") == NULL
        && (add_fast_method(&NullType, "__enter__", return_self, 0) < 0
            || add_fast_method(&NullType, "__exit__", return_none, 3) < 0
            || add_fast_method(&RangeType, "__enter__", (fastfunc)range_enter, 0) < 0
            || add_fast_method(&RangeType, "__exit__", (fastfunc)range_exit, 3) < 0))
        return NULL;
    if (nulls == NULL) {
        nulls = PyDict_New();
        str_default = PyUnicode_InternFromString("_DEFAULT");
        str_spans = PyUnicode_InternFromString("_spans");
        str_extend = PyUnicode_InternFromString("extend");
        tls_key = PyUnicode_InternFromString("srtscope.probes._fastrange.ThreadState");
        if (!nulls || !str_default || !str_spans || !str_extend || !tls_key)
            return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "ThreadState", (PyObject *)&ThreadStateType) < 0
        || PyModule_AddObjectRef(m, "NullRange", (PyObject *)&NullType) < 0
        || PyModule_AddObjectRef(m, "Range", (PyObject *)&RangeType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
