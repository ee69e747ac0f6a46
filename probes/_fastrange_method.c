/* srtscope.probes._fastrange, part: FastMethod and BoundMethod (see _fastrange.h, _fastrange.c). */
#include "_fastrange.h"

/* ---- FastMethod: __enter__ / __exit__ without a bound-method allocation --------------------- */

/* NOTE: on Python 3.11 a `with` looks __enter__ and __exit__ up as bound methods, and a C method's
 * binding is a new object each time: two allocations per range, a fifth of a recorder-only range's
 * cost. These descriptors bind through a free list instead. Unbound (`type(r).__exit__(r, ...)`,
 * as contextlib.ExitStack calls it) they take the instance as first argument. */
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
PyTypeObject BoundType = {
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

PyTypeObject FastMethodType = {
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
int
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
