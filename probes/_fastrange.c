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
 * NOTE: single-phase init with static state: one interpreter per process, as the package assumes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

enum { MODE_OFF = 0, MODE_FAST = 1, MODE_PYTHON = 2 };

static int mode = MODE_OFF;
static PyObject *py_stage = NULL;      /* ranges._py_stage: MODE_PYTHON, and odd call shapes */
static PyObject *decorator = NULL;     /* ranges._Decorator: decorator(name, attrs)(fn) */
static PyObject *recorder_ns = NULL;   /* the recorder module's __dict__ (its _DEFAULT changes) */
static PyObject *nulls = NULL;         /* name -> cached Null */
static PyObject *str_default = NULL;   /* "_DEFAULT" */
static PyObject *str_spans = NULL;     /* "_spans" */
static PyObject *str_extend = NULL;    /* "extend" */
static PyObject *tls_key = NULL;       /* key of the ThreadState in each thread state dict */

static inline long long
clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- ThreadState: native tid + nesting depth of one thread ------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *tid;       /* int, threading.get_native_id() of the thread */
    PyObject *depth;     /* int, ranges open on the thread */
} ThreadState;
/* NOTE: depth is an int object, not a C integer: the Python path's `ts.depth += 1` on an object
 * member is specialized by the 3.11 interpreter (as on a __slots__ class); on a C integer member
 * it is not, and cost the NVTX ranges ~100 ns. Depths below 257 are cached ints: no allocation. */

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

static PyTypeObject ThreadStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "srtscope.probes._fastrange.ThreadState",
    .tp_basicsize = sizeof(ThreadState),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)ts_dealloc,
    .tp_members = ts_members,
    .tp_doc = "Per-thread probe state: native tid and nesting depth.",
};

/* The calling thread's ThreadState (borrowed), created on first use. */
static ThreadState *
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

/* ---- FastMethod: __enter__ / __exit__ without a bound-method allocation --------------------- */

/* NOTE: on Python 3.11 a `with` looks __enter__ and __exit__ up as bound methods, and a C method's
 * binding is a new object each time: two allocations per range, a fifth of a recorder-only range's
 * cost. These descriptors bind through a free list instead. Unbound (`type(r).__exit__(r, ...)`,
 * as contextlib.ExitStack calls it) they take the instance as first argument. */
typedef PyObject *(*fastfunc)(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *owner;     /* the type whose instances it takes */
    PyObject *name;          /* "__enter__" / "__exit__" */
    fastfunc func;
    Py_ssize_t nargs;        /* arguments after self */
} FastMethod;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    FastMethod *method;
    PyObject *self;
} Bound;

static PyTypeObject FastMethodType, BoundType;

#define BOUND_FREE_MAX 64
static Bound *free_bound[BOUND_FREE_MAX];
static int n_free_bound = 0;

static PyObject *
fast_call(FastMethod *m, PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!PyObject_TypeCheck(self, m->owner)) {
        PyErr_Format(PyExc_TypeError, "%U needs a %s, not %s", m->name, m->owner->tp_name, Py_TYPE(self)->tp_name);
        return NULL;
    }
    if (nargs != m->nargs) {
        PyErr_Format(PyExc_TypeError, "%U takes %zd arguments (%zd given)", m->name, m->nargs, nargs);
        return NULL;
    }
    return m->func(self, args, nargs);
}

static PyObject *
bound_vectorcall(Bound *b, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) {
        PyErr_Format(PyExc_TypeError, "%U takes no keyword arguments", b->method->name);
        return NULL;
    }
    return fast_call(b->method, b->self, args, PyVectorcall_NARGS(nargsf));
}

static void
bound_dealloc(Bound *b)
{
    Py_CLEAR(b->self);
    Py_CLEAR(b->method);
    if (n_free_bound < BOUND_FREE_MAX)
        free_bound[n_free_bound++] = b;
    else
        PyObject_Free(b);
}

static PyObject *
bound_repr(Bound *b)
{
    return PyUnicode_FromFormat("<method %U of %s object at %p>", b->method->name, Py_TYPE(b->self)->tp_name, b->self);
}

/* NOTE: not GC-tracked: it holds only its instance, and nothing a range holds leads back to it */
static PyTypeObject BoundType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "srtscope.probes._fastrange.BoundMethod",
    .tp_basicsize = sizeof(Bound),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Bound, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dealloc = (destructor)bound_dealloc,
    .tp_repr = (reprfunc)bound_repr,
};

static PyObject *
fast_descr_get(FastMethod *m, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(m);
    Bound *b;
    if (n_free_bound > 0) {
        b = free_bound[--n_free_bound];
        PyObject_Init((PyObject *)b, &BoundType);
    }
    else if ((b = PyObject_New(Bound, &BoundType)) == NULL)
        return NULL;
    b->vectorcall = (vectorcallfunc)bound_vectorcall;
    b->method = (FastMethod *)Py_NewRef(m);
    b->self = Py_NewRef(obj);
    return (PyObject *)b;
}

static PyObject *
fast_vectorcall(FastMethod *m, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames)) || nargs < 1) {
        PyErr_Format(PyExc_TypeError, "%U takes the instance and %zd positional arguments", m->name, m->nargs);
        return NULL;
    }
    return fast_call(m, args[0], args + 1, nargs - 1);
}

static void
fast_dealloc(FastMethod *m)
{
    Py_XDECREF(m->name);
    PyObject_Free(m);
}

static PyObject *
fast_repr(FastMethod *m)
{
    return PyUnicode_FromFormat("<method %U of %s objects>", m->name, m->owner->tp_name);
}

static PyTypeObject FastMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "srtscope.probes._fastrange.FastMethod",
    .tp_basicsize = sizeof(FastMethod),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(FastMethod, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = (descrgetfunc)fast_descr_get,
    .tp_dealloc = (destructor)fast_dealloc,
    .tp_repr = (reprfunc)fast_repr,
};

/* type.<name> = a FastMethod calling func with nargs arguments (after PyType_Ready) */
static int
add_fast_method(PyTypeObject *type, const char *name, fastfunc func, Py_ssize_t nargs)
{
    FastMethod *m = PyObject_New(FastMethod, &FastMethodType);
    if (m == NULL)
        return -1;
    m->vectorcall = (vectorcallfunc)fast_vectorcall;
    m->owner = type;
    m->func = func;
    m->nargs = nargs;
    if ((m->name = PyUnicode_InternFromString(name)) == NULL) {
        Py_DECREF(m);
        return -1;
    }
    int rc = PyDict_SetItem(type->tp_dict, m->name, (PyObject *)m);
    Py_DECREF(m);
    PyType_Modified(type);
    return rc;
}

/* attrs dict from a vectorcall's keyword names and values */
static PyObject *
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

/* ---- Null: a disabled range ---------------------------------------------------------------- */

/* NOTE: a null with attributes keeps the call's keyword names and values as they came (ob_size
 * values inline, one allocation) and builds the dict only if it is used as a decorator: disabled,
 * a range with attributes costs about what one without does. */
typedef struct {
    PyObject_VAR_HEAD
    PyObject *name;
    PyObject *kwnames;   /* tuple of attribute names, or NULL: the cached attribute-less null */
    PyObject *values[1];
} Null;

static int
null_traverse(Null *self, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < Py_SIZE(self); i++)
        Py_VISIT(self->values[i]);
    return 0;
}

static int
null_clear(Null *self)
{
    for (Py_ssize_t i = 0; i < Py_SIZE(self); i++)
        Py_CLEAR(self->values[i]);
    return 0;
}

static void
null_dealloc(Null *self)
{
    PyObject_GC_UnTrack(self);
    Py_XDECREF(self->name);
    Py_XDECREF(self->kwnames);
    for (Py_ssize_t i = 0; i < Py_SIZE(self); i++)
        Py_XDECREF(self->values[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
null_get_attrs(Null *self, void *Py_UNUSED(closure))
{
    if (self->kwnames == NULL)
        return PyDict_New();
    for (Py_ssize_t i = 0; i < Py_SIZE(self); i++)
        if (self->values[i] == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "null range was cleared");
            return NULL;
        }
    return kw_dict(self->values, self->kwnames);
}

static PyObject *
return_self(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_INCREF(self);
    return self;
}

static PyObject *
return_none(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_RETURN_NONE;
}

static PyObject *
null_set(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs) {
        PyErr_SetString(PyExc_TypeError, "set() takes keyword arguments only");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* decorator(name, attrs)(fn): the Python decorator, which checks `enabled` at each call */
static PyObject *
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

static PyObject *
null_call(Null *self, PyObject *args, PyObject *kwargs)
{
    PyObject *attrs = null_get_attrs(self, NULL);
    if (attrs == NULL)
        return NULL;
    PyObject *out = decorate(self->name, attrs, args, kwargs);
    Py_DECREF(attrs);
    return out;
}

static PyMethodDef null_methods[] = {
    {"set", (PyCFunction)(void (*)(void))null_set, METH_FASTCALL | METH_KEYWORDS, "No-op while disabled."},
    {NULL}
};

static PyMemberDef null_members[] = {
    {"name", T_OBJECT_EX, offsetof(Null, name), READONLY, NULL},
    {NULL}
};

static PyGetSetDef null_getset[] = {
    {"attrs", (getter)null_get_attrs, NULL, "The attributes given (a new dict).", NULL},
    {NULL}
};

static PyTypeObject NullType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "srtscope.probes._fastrange.NullRange",
    .tp_basicsize = offsetof(Null, values),
    .tp_itemsize = sizeof(PyObject *),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)null_dealloc,
    .tp_traverse = (traverseproc)null_traverse,
    .tp_clear = (inquiry)null_clear,
    .tp_call = (ternaryfunc)null_call,
    .tp_methods = null_methods,
    .tp_members = null_members,
    .tp_getset = null_getset,
    .tp_doc = "Disabled range: enter, exit and set() do nothing; as a decorator, see ranges._Decorator.",
};

/* a null for name; with kwnames, keeping values[0:len(kwnames)] */
static PyObject *
null_new(PyObject *name, PyObject *const *values, PyObject *kwnames)
{
    Py_ssize_t n = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    Null *self = PyObject_GC_NewVar(Null, &NullType, n);
    if (self == NULL)
        return NULL;
    self->name = Py_NewRef(name);
    self->kwnames = Py_XNewRef(kwnames);
    for (Py_ssize_t i = 0; i < n; i++)
        self->values[i] = Py_NewRef(values[i]);
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* ---- Range: an enabled range, recorder only ------------------------------------------------ */

static PyTypeObject RangeType;

typedef struct {
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

static PyObject *
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

static PyObject *
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

static PyTypeObject RangeType = {
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

/* ---- module functions ------------------------------------------------------------------------ */

static PyObject *
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
