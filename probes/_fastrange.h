/* Internal to srtscope.probes._fastrange: what its translation units share (the module and its
 * overview: _fastrange.c). One extension (setup.py builds the four files into one .so):
 *
 *   _fastrange.c         module state, helpers of both range kinds, module functions, PyInit__fastrange
 *   _fastrange_method.c  FastMethod / BoundMethod: __enter__ / __exit__ without a bound-method allocation
 *   _fastrange_null.c    NullRange: a disabled range
 *   _fastrange_range.c   ThreadState, Range (an enabled range, recorder only) and stage()
 */
#ifndef SRTSCOPE_FASTRANGE_H
#define SRTSCOPE_FASTRANGE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

/* NOTE: what the files share is hidden: linked into this module only, not exported from it */
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

enum { MODE_OFF = 0, MODE_FAST = 1, MODE_PYTHON = 2 };

extern int mode;
extern PyObject *py_stage;      /* ranges._py_stage: MODE_PYTHON, and odd call shapes */
extern PyObject *decorator;     /* ranges._Decorator: decorator(name, attrs)(fn) */
extern PyObject *recorder_ns;   /* the recorder module's __dict__ (its _DEFAULT changes) */
extern PyObject *nulls;         /* name -> cached Null */
extern PyObject *str_default;   /* "_DEFAULT" */
extern PyObject *str_spans;     /* "_spans" */
extern PyObject *str_extend;    /* "extend" */
extern PyObject *tls_key;       /* key of the ThreadState in each thread state dict */

static inline long long
clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- ThreadState: native tid + nesting depth of one thread (_fastrange_range.c) ----------- */

typedef struct {
    PyObject_HEAD
    PyObject *tid;       /* int, threading.get_native_id() of the thread */
    PyObject *depth;     /* int, ranges open on the thread */
} ThreadState;
/* NOTE: depth is an int object, not a C integer: the Python path's `ts.depth += 1` on an object
 * member is specialized by the 3.11 interpreter (as on a __slots__ class); on a C integer member
 * it is not, and cost the NVTX ranges ~100 ns. Depths below 257 are cached ints: no allocation. */

/* a FastMethod's function: the instance, then the arguments after it (_fastrange_method.c) */
typedef PyObject *(*fastfunc)(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

extern PyTypeObject ThreadStateType, FastMethodType, BoundType, NullType, RangeType;

/* _fastrange.c */
PyObject *kw_dict(PyObject *const *values, PyObject *kwnames);
PyObject *decorate(PyObject *name, PyObject *attrs, PyObject *args, PyObject *kwargs);

/* _fastrange_method.c */
int add_fast_method(PyTypeObject *type, const char *name, fastfunc func, Py_ssize_t nargs);

/* _fastrange_null.c */
PyObject *null_new(PyObject *name, PyObject *const *values, PyObject *kwnames);
PyObject *return_self(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *return_none(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* _fastrange_range.c */
struct Range;
ThreadState *thread_state_get(void);
PyObject *range_enter(struct Range *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *range_exit(struct Range *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *stage(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif /* SRTSCOPE_FASTRANGE_H */
