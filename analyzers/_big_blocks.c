/* numpy's large arrays in one reserved region of address space, their pages kept for reuse.
 *
 * A numpy memory handler (NEP 49): arrays of at least MIN_BYTES come from a region reserved once
 * (anonymous, MAP_NORESERVE), first fit by address with free neighbours merged; smaller ones, and
 * any that do not fit, come from the C library as before. A freed block keeps its pages: the next
 * array in its place faults in no new zeroed page (in a VM, each costs microseconds of system
 * time). Only numpy's big arrays live here, so when one pass's arrays are freed their blocks merge
 * into one free run whatever the pass held of other sizes: the next pass reuses it whole.
 * `give_back` returns the free blocks' pages to the system (madvise), as malloc_trim does the heap.
 * Blocks start on page boundaries: a header of HEAD bytes, then the array (64-byte aligned).
 * One lock over the free list; a fork holds it (pthread_atfork) so the copy starts consistent.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MIN_BYTES (256u << 10)
#define HEAD 64u
#define PAGE 4096u
#define API_SET_HANDLER 304
#define API_GET_HANDLER 305

typedef struct {            /* numpy/ndarraytypes.h, version 1 */
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} Allocator;

typedef struct {
    char name[127];
    uint8_t version;
    Allocator allocator;
} Handler;

typedef struct {
    size_t off, len;        /* bytes from the region's base, multiples of PAGE */
    int zero;               /* never written since it was reserved or given back */
} Free;

static char *base;          /* NULL: no region */
static size_t cap, top;     /* reserved; handed out or freed below top (the rest never touched) */
static Free *frees;
static size_t nfree, room;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork(void) { pthread_mutex_unlock(&lock); }

static int
in_region(const void *p)
{
    return base != NULL && (const char *)p >= base && (const char *)p < base + cap;
}

/* bytes of the block that holds an array of size bytes (0: too large to hold) */
static size_t
block_len(size_t size)
{
    return size > SIZE_MAX / 2 ? 0 : (size + HEAD + PAGE - 1) / PAGE * PAGE;
}

/* the index of the first free block at or after off (nfree: none) */
static size_t
find(size_t off)
{
    size_t lo = 0, hi = nfree;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (frees[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void
drop(size_t i)
{
    memmove(frees + i, frees + i + 1, (nfree - i - 1) * sizeof(Free));
    nfree--;
}

/* len bytes taken from the front of free block i (it holds at least that many): their offset */
static size_t
cut(size_t i, size_t len)
{
    size_t off = frees[i].off;
    frees[i].off += len;
    frees[i].len -= len;
    if (frees[i].len == 0)
        drop(i);
    return off;
}

/* where a block of len bytes goes: the first free block that holds it (its index), else the free
 * run at the top grown into the untouched space above it (nfree + 1), else the untouched space
 * (nfree + 2); nfree + 3: no room */
static size_t
place(size_t len)
{
    for (size_t i = 0; i < nfree; i++)
        if (frees[i].len >= len)
            return i;
    if (nfree && frees[nfree - 1].off + frees[nfree - 1].len == top && cap - top >= len - frees[nfree - 1].len)
        return nfree + 1;
    return cap - top >= len ? nfree + 2 : nfree + 3;
}

/* a block of len bytes (a multiple of PAGE): its offset, or (size_t)-1; *zero: all its pages zero */
static size_t
take(size_t len, int *zero)
{
    size_t at = place(len), off;
    if (at < nfree) {
        *zero = frees[at].zero;
        return cut(at, len);
    }
    if (at == nfree + 1) {              /* the top run grown: its pages kept */
        off = frees[nfree - 1].off;
        *zero = frees[nfree - 1].zero;
        drop(nfree - 1);
    } else if (at == nfree + 2) {
        off = top;
        *zero = 1;
    } else {
        return (size_t)-1;
    }
    top = off + len;
    return off;
}

/* bytes of new pages (untouched, or given back) a block for size bytes would take where ``take``
 * puts it: 0 where it lands on pages the region holds free */
static size_t
fresh_for(size_t size)
{
    size_t len = block_len(size), at = place(len);
    if (at < nfree)
        return frees[at].zero ? len : 0;
    if (at == nfree + 1)
        return frees[nfree - 1].zero ? len : len - frees[nfree - 1].len;
    return len;
}

/* the block [off, off + len) free again, merged with free neighbours (its pages kept) */
static int
put(size_t off, size_t len, int zero)
{
    size_t i = find(off);
    int left = i > 0 && frees[i - 1].off + frees[i - 1].len == off;
    int right = i < nfree && off + len == frees[i].off;
    if (left && right) {
        frees[i - 1].len += len + frees[i].len;
        frees[i - 1].zero &= zero & frees[i].zero;
        drop(i);
    } else if (left) {
        frees[i - 1].len += len;
        frees[i - 1].zero &= zero;
    } else if (right) {
        frees[i].off = off;
        frees[i].len += len;
        frees[i].zero &= zero;
    } else {
        if (nfree == room) {
            size_t more = room ? 2 * room : 256;
            Free *f = realloc(frees, more * sizeof(Free));
            if (f == NULL)
                return -1;
            frees = f;
            room = more;
        }
        memmove(frees + i + 1, frees + i, (nfree - i) * sizeof(Free));
        frees[i] = (Free){off, len, zero};
        nfree++;
    }
    return 0;
}

static void *
region_alloc(size_t size, int *zero)
{
    size_t len = block_len(size);
    if (base == NULL || size < MIN_BYTES || len == 0)
        return NULL;
    pthread_mutex_lock(&lock);
    size_t off = take(len, zero);
    pthread_mutex_unlock(&lock);
    if (off == (size_t)-1)
        return NULL;
    *(size_t *)(base + off) = len;
    return base + off + HEAD;
}

static void *
h_malloc(void *ctx, size_t size)
{
    int zero;
    void *p = region_alloc(size, &zero);
    return p != NULL ? p : malloc(size);
}

static void *
h_calloc(void *ctx, size_t nelem, size_t elsize)
{
    if (elsize && nelem > SIZE_MAX / elsize)
        return NULL;
    int zero;
    void *p = region_alloc(nelem * elsize, &zero);
    if (p == NULL)
        return calloc(nelem, elsize);
    if (!zero)
        memset(p, 0, nelem * elsize);
    return p;
}

static void
h_free(void *ctx, void *ptr, size_t size)
{
    if (!in_region(ptr)) {
        free(ptr);
        return;
    }
    char *blk = (char *)ptr - HEAD;
    size_t len = *(size_t *)blk;
    pthread_mutex_lock(&lock);
    int failed = put((size_t)(blk - base), len, 0);
    pthread_mutex_unlock(&lock);
    if (failed)             /* no room to note it: its pages go back, the block stays taken */
        madvise(blk, len, MADV_DONTNEED);
}

/* the block at off, of len bytes, grown in place to want bytes where the free block after it or
 * the untouched space above top has room: 1 if it was, 0 if not (the caller moves it) */
static int
grow(size_t off, size_t len, size_t want)
{
    size_t more = want - len, end = off + len;
    if (end == top && cap - top >= more) {
        top += more;
        return 1;
    }
    size_t i = find(end);
    if (i == nfree || frees[i].off != end || frees[i].len < more)
        return 0;
    cut(i, more);
    return 1;
}

static void *
h_realloc(void *ctx, void *ptr, size_t new_size)
{
    if (!in_region(ptr))
        return realloc(ptr, new_size);
    char *blk = (char *)ptr - HEAD;
    size_t len = *(size_t *)blk, off = (size_t)(blk - base);
    size_t want = block_len(new_size);
    if (want && new_size >= MIN_BYTES) {
        int done = 0;
        pthread_mutex_lock(&lock);
        if (want <= len)            /* shrunk: the pages past it are free again */
            done = want == len || put(off + want, len - want, 0) == 0;
        else
            done = grow(off, len, want);
        pthread_mutex_unlock(&lock);
        if (done) {
            *(size_t *)blk = want;
            return ptr;
        }
    }
    void *q = h_malloc(ctx, new_size);
    if (q == NULL)
        return NULL;
    memcpy(q, ptr, new_size < len - HEAD ? new_size : len - HEAD);
    h_free(ctx, ptr, 0);
    return q;
}

static Handler handler = {"srtscope_big_blocks", 1, {NULL, h_malloc, h_calloc, h_realloc, h_free}};
static PyObject *capsule;   /* the handler, as numpy takes it */
static void **api;          /* numpy's C-API table */

static PyObject *
reserve(PyObject *self, PyObject *arg)
{
    size_t want = PyLong_AsSize_t(arg);
    if (want == (size_t)-1 && PyErr_Occurred())
        return NULL;
    if (base != NULL)
        Py_RETURN_TRUE;
    want = want / PAGE * PAGE;
    void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED || want == 0)
        Py_RETURN_FALSE;
    if (pthread_atfork(before_fork, after_fork, after_fork) != 0) {
        munmap(p, want);
        Py_RETURN_FALSE;
    }
    base = p;
    cap = want;
    Py_RETURN_TRUE;
}

/* numpy's C-API table, checked: its GetHandler answers a "mem_handler" capsule */
static int
numpy_api(void)
{
    if (api != NULL)
        return 0;
    PyObject *m = PyImport_ImportModule("numpy._core._multiarray_umath");
    if (m == NULL) {
        PyErr_Clear();
        m = PyImport_ImportModule("numpy.core._multiarray_umath");
    }
    if (m == NULL)
        return -1;
    PyObject *c = PyObject_GetAttrString(m, "_ARRAY_API");
    Py_DECREF(m);
    if (c == NULL)
        return -1;
    void **t = PyCapsule_GetPointer(c, NULL);
    Py_DECREF(c);          /* the module keeps the table */
    if (t == NULL)
        return -1;
    PyObject *h = ((PyObject * (*)(void)) t[API_GET_HANDLER])();
    if (h == NULL)
        return -1;
    int ok = PyCapsule_IsValid(h, "mem_handler");
    Py_DECREF(h);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "numpy's C-API has no memory handler where expected");
        return -1;
    }
    api = t;
    return 0;
}

static PyObject *
use(PyObject *self, PyObject *noargs)
{
    if (base == NULL)
        Py_RETURN_FALSE;
    if (numpy_api() < 0)
        return NULL;
    if (capsule == NULL && (capsule = PyCapsule_New(&handler, "mem_handler", NULL)) == NULL)
        return NULL;
    PyObject *old = ((PyObject * (*)(PyObject *)) api[API_SET_HANDLER])(capsule);
    if (old == NULL)
        return NULL;
    Py_DECREF(old);
    Py_RETURN_TRUE;
}

static PyObject *
give_back(PyObject *self, PyObject *noargs)
{
    size_t given = 0;
    pthread_mutex_lock(&lock);
    if (nfree && frees[nfree - 1].off + frees[nfree - 1].len == top) {
        nfree--;            /* the run at the top: below top only what was handed out */
        madvise(base + frees[nfree].off, frees[nfree].len, MADV_DONTNEED);
        given += frees[nfree].zero ? 0 : frees[nfree].len;
        top = frees[nfree].off;
    }
    for (size_t i = 0; i < nfree; i++)
        if (!frees[i].zero) {
            madvise(base + frees[i].off, frees[i].len, MADV_DONTNEED);
            given += frees[i].len;
            frees[i].zero = 1;
        }
    pthread_mutex_unlock(&lock);
    return PyLong_FromSize_t(given);
}

static PyObject *
fresh_bytes(PyObject *self, PyObject *arg)
{
    size_t size = PyLong_AsSize_t(arg);
    if (size == (size_t)-1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&lock);
    size_t n = base == NULL ? 0 : fresh_for(size);
    pthread_mutex_unlock(&lock);
    return PyLong_FromSize_t(n);
}

static PyObject *
stats(PyObject *self, PyObject *noargs)
{
    size_t held = 0, spare = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nfree; i++) {
        held += frees[i].len;
        spare += frees[i].zero ? 0 : frees[i].len;
    }
    size_t t = top;
    pthread_mutex_unlock(&lock);
    return Py_BuildValue("nnn", (Py_ssize_t)t, (Py_ssize_t)(t - held), (Py_ssize_t)spare);
}

static PyMethodDef methods[] = {
    {"reserve", reserve, METH_O, "reserve(bytes) -> whether the region is there (once per process)"},
    {"use", use, METH_NOARGS, "use() -> numpy's arrays in this thread's context come from the region"},
    {"give_back", give_back, METH_NOARGS, "give_back() -> bytes of free blocks' pages given back"},
    {"fresh_bytes", fresh_bytes, METH_O,
     "fresh_bytes(size) -> bytes of new pages an array of size bytes would take (0: held free pages hold it)"},
    {"stats", stats, METH_NOARGS, "stats() -> (top, bytes in use, free bytes whose pages are held)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_big_blocks", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__big_blocks(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "MIN_BYTES", MIN_BYTES)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
