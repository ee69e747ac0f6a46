/* srtscope.probes._fastrange, part: NullRange, a disabled range (see _fastrange.h, _fastrange.c). */
#include "_fastrange.h"

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

PyObject *
return_self(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_INCREF(self);
    return self;
}

PyObject *
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

PyTypeObject NullType = {
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
PyObject *
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
