/* The compiled loops of sqlite_pages.py: an SQLite table b-tree's pages decoded byte by byte.
 *
 * File format: https://www.sqlite.org/fileformat2.html (b-tree pages, record format).
 * Both functions read only inside the buffers they are given, whatever the file's bytes say: each
 * page lies whole in the buffer with PAD bytes after it (checked on entry), and every offset a page
 * gives is checked against its page before it is read; a damaged page answers a status. Rows are
 * written only below `cap`. The GIL is released while a batch is decoded (two reading threads
 * decode on two cores).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define PAD 32
enum { OK = 0, ODD_PAGE = 1, NOT_INT = 2, OUT_OF_ORDER = 3 };
enum { LEAF = 0x0D, INTERIOR = 0x05 };

/* the varint at p (1-9 bytes); *end: the byte after it */
static inline int64_t
varint(const uint8_t *p, const uint8_t **end)
{
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) {
        uint8_t b = p[k];
        v = (v << 7) | (b & 0x7F);
        if (b < 0x80) {
            *end = p + k + 1;
            return (int64_t)v;
        }
    }
    *end = p + 9;
    return (int64_t)((v << 8) | p[8]);
}

/* the rows of one leaf page: rowids must lie in (low, high], the page's bounds in its tree */
static int
decode_page(const uint8_t *pg, int64_t low, int64_t high, int64_t usable, const int64_t *want,
            Py_ssize_t nw, int64_t lo, int64_t hi, int64_t *prev, int64_t *vals, uint8_t *nulls,
            Py_ssize_t cap, Py_ssize_t *r)
{
    if (pg[0] != LEAF)
        return ODD_PAGE;
    int64_t n = ((int64_t)pg[3] << 8) | pg[4];
    if (n > (usable - 8) / 6)                      /* more cells than a page holds: SQLite's MX_CELL */
        return ODD_PAGE;
    int64_t top = want[nw - 1];
    for (int64_t i = 0; i < n; i++) {
        int64_t c = ((int64_t)pg[8 + 2 * i] << 8) | pg[9 + 2 * i];
        if (c < 8 + 2 * n || c >= usable)
            return ODD_PAGE;
        const uint8_t *q;
        int64_t plen = varint(pg + c, &q);
        int64_t rid = varint(q, &q);
        int64_t at = q - pg;                       /* the payload's offset in the page */
        if (plen < 0 || plen > usable - 35 || at + plen > usable)
            return ODD_PAGE;                       /* a row on overflow pages, or past its page */
        if (rid <= *prev)
            return OUT_OF_ORDER;
        if (rid <= low || rid > high)
            return ODD_PAGE;                       /* not where the interior pages say */
        *prev = rid;
        if (rid < lo || rid > hi)
            continue;
        if (*r >= cap)
            return ODD_PAGE;
        const uint8_t *h;
        int64_t hs = varint(q, &h);
        if (hs < 1 || hs > plen || h > q + hs)
            return ODD_PAGE;
        const uint8_t *hend = q + hs, *end = q + plen, *body = hend;
        Py_ssize_t j = 0;
        /* every serial type is read, past the wanted ones too: the record's sizes must add up to
         * its payload exactly (SQLite's own check; a record that does not is SQLite's to judge) */
        for (int64_t col = 0; col <= top || h < hend; col++) {
            if (h >= hend)
                return ODD_PAGE;                   /* fewer columns than the table: a default */
            int64_t t;
            if (*h < 0x80)
                t = *h++;
            else
                t = varint(h, &h);
            int64_t sz;
            if (t >= 12)
                sz = (t - 12) >> 1;
            else if (t == 5)
                sz = 6;
            else if (t == 6 || t == 7)
                sz = 8;
            else if (t >= 0 && t <= 4)
                sz = t;
            else if (t == 8 || t == 9)
                sz = 0;
            else
                return ODD_PAGE;
            if (sz > end - body)
                return ODD_PAGE;
            if (j < nw && want[j] == col) {
                if (t == 7 || t >= 10)
                    return NOT_INT;
                int64_t v = 0;
                if (t == 9)
                    v = 1;
                else if (sz > 0) {
                    v = (int8_t)body[0];
                    for (int64_t k = 1; k < sz; k++)
                        v = (int64_t)(((uint64_t)v << 8) | body[k]);
                }
                vals[j * cap + *r] = v;
                nulls[j * cap + *r] = t == 0;
                j++;
            }
            body += sz;
        }
        if (h != hend || body != end)
            return ODD_PAGE;
        (*r)++;
    }
    return OK;
}

static PyObject *
leaves(PyObject *self, PyObject *args)
{
    Py_buffer buf, at, low, high, want, vals, nulls;
    Py_ssize_t psz, usable, cap;
    long long lo, hi, prev;
    if (!PyArg_ParseTuple(args, "y*y*y*y*nny*LLLw*w*n", &buf, &at, &low, &high, &psz, &usable, &want,
                          &lo, &hi, &prev, &vals, &nulls, &cap))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t np_ = at.len / 8, nw = want.len / 8;
    const int64_t *offs = at.buf, *w = want.buf, *lows = low.buf, *highs = high.buf;
    int bad = psz < 512 || usable < 480 || usable > psz || nw < 1 || cap < 0 || low.len < at.len
              || high.len < at.len || vals.len < nw * cap * 8 || nulls.len < nw * cap;
    for (Py_ssize_t j = 0; !bad && j < nw; j++)
        bad = w[j] < 0 || (j && w[j] <= w[j - 1]);
    for (Py_ssize_t p = 0; !bad && p < np_; p++)
        bad = offs[p] < 0 || offs[p] + psz + PAD > buf.len;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "leaves: buffers that do not hold what they are said to");
        goto done;
    }
    Py_ssize_t r = 0;
    int64_t last = prev;
    int status = OK;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < np_ && status == OK; p++)
        status = decode_page((const uint8_t *)buf.buf + offs[p], lows[p], highs[p], usable, w, nw, lo, hi,
                             &last, vals.buf, nulls.buf, cap, &r);
    Py_END_ALLOW_THREADS
    out = Py_BuildValue("nLi", r, (long long)last, status);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&at);
    PyBuffer_Release(&low);
    PyBuffer_Release(&high);
    PyBuffer_Release(&want);
    PyBuffer_Release(&vals);
    PyBuffer_Release(&nulls);
    return out;
}

static PyObject *
interior(PyObject *self, PyObject *args)
{
    Py_buffer page, kids, keys;
    Py_ssize_t off, psz, usable;
    if (!PyArg_ParseTuple(args, "y*nnnw*w*", &page, &off, &psz, &usable, &kids, &keys))
        return NULL;
    PyObject *out = NULL;
    /* `off`: where the b-tree header starts in the page (100 on page 1, after the file header); the
     * page itself is still the buffer's first psz bytes */
    if (off < 0 || off + 12 > usable || usable > psz || page.len < psz + PAD || kids.len / 8 < 1
        || keys.len < kids.len) {
        PyErr_SetString(PyExc_ValueError, "interior: buffers that do not hold what they are said to");
        goto done;
    }
    const uint8_t *pg = (const uint8_t *)page.buf;
    int64_t *kid = kids.buf, *key = keys.buf;
    Py_ssize_t room = kids.len / 8;
    long long got = -1;
    int64_t n = ((int64_t)pg[off + 3] << 8) | pg[off + 4];
    if (pg[off] == INTERIOR && n + 1 <= room && off + 12 + 2 * n <= usable) {
        got = n + 1;
        for (int64_t i = 0; i < n && got > 0; i++) {
            int64_t c = ((int64_t)pg[off + 12 + 2 * i] << 8) | pg[off + 13 + 2 * i];
            if (c < off + 12 + 2 * n || c + 4 > usable) {
                got = -1;
                break;
            }
            kid[i] = ((int64_t)pg[c] << 24) | ((int64_t)pg[c + 1] << 16) | ((int64_t)pg[c + 2] << 8) | pg[c + 3];
            const uint8_t *e;
            key[i] = varint(pg + c + 4, &e);
        }
        const uint8_t *rp = pg + off + 8;
        if (got > 0)
            kid[n] = ((int64_t)rp[0] << 24) | ((int64_t)rp[1] << 16) | ((int64_t)rp[2] << 8) | rp[3];
    }
    out = PyLong_FromLongLong(got);
done:
    PyBuffer_Release(&page);
    PyBuffer_Release(&kids);
    PyBuffer_Release(&keys);
    return out;
}

static PyMethodDef methods[] = {
    {"leaves", leaves, METH_VARARGS,
     "leaves(buf, at, low, high, psz, usable, want, lo, hi, prev, vals, nulls, cap) -> (rows, last rowid, status)"},
    {"interior", interior, METH_VARARGS,
     "interior(page, off, psz, usable, kids, keys) -> children, or -1 for anything odd"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sqlite_pages", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__sqlite_pages(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "PAD", PAD) || PyModule_AddIntConstant(m, "OK", OK)
        || PyModule_AddIntConstant(m, "ODD_PAGE", ODD_PAGE) || PyModule_AddIntConstant(m, "NOT_INT", NOT_INT)
        || PyModule_AddIntConstant(m, "OUT_OF_ORDER", OUT_OF_ORDER) || PyModule_AddIntConstant(m, "LEAF", LEAF)
        || PyModule_AddIntConstant(m, "INTERIOR", INTERIOR)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
