/* The common case of a content check by fingerprints, in C: for each name of one directory, whether
 * its lstat reads as the fingerprint recorded for it (fingerprint.py). In Python each file costs
 * a stat_result, five attribute reads, a pack and a hex besides its stat, half again the stat's
 * own time; here the stats and the comparisons of a whole directory run in one loop, without the
 * interpreter's lock, so the page read ahead (reconcile/targets.py) runs beside them.
 *
 * This module only says "same": it never makes a fingerprint nor decides anything else. A name it
 * does not find the same (changed, missing, unreadable, no fingerprint recorded) goes through
 * fingerprint.py's own stats, which remain the whole check where this module is not built. The
 * text compared is fingerprint.stamp's: device, inode, size, mtime_ns and ctime_ns, each a 64-bit
 * little-endian integer (the sizes and times signed), as lowercase hex.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#ifdef __APPLE__
#define st_mtim st_mtimespec
#define st_ctim st_ctimespec
#endif

#define STAMP_LEN 80 /* five 8-byte integers as hex */

static void hex_le(char *out, uint64_t value) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 8; i++) {
        unsigned byte = (unsigned)(value >> (8 * i)) & 0xffu;
        out[2 * i] = digits[byte >> 4];
        out[2 * i + 1] = digits[byte & 15u];
    }
}

/* A time in nanoseconds as os.stat gives it; 0 when it does not fit in 64 bits (past 2262), where
 * fingerprint.stamp makes no fingerprint either. */
static int ns_of(struct timespec t, int64_t *ns) {
    if (__builtin_mul_overflow((int64_t)t.tv_sec, (int64_t)1000000000, ns)) {
        return 0;
    }
    return !__builtin_add_overflow(*ns, (int64_t)t.tv_nsec, ns);
}

/* Whether ``name`` in ``dir_fd``, not followed if a symlink, reads as ``recorded``. */
static int same_stamp(int dir_fd, const char *name, const char *recorded) {
    struct stat st;
    int64_t mtime, ctime;
    char text[STAMP_LEN];
    if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        return 0;
    }
    if (!ns_of(st.st_mtim, &mtime) || !ns_of(st.st_ctim, &ctime)) {
        return 0;
    }
    hex_le(text, (uint64_t)st.st_dev);
    hex_le(text + 16, (uint64_t)st.st_ino);
    hex_le(text + 32, (uint64_t)(int64_t)st.st_size);
    hex_le(text + 48, (uint64_t)mtime);
    hex_le(text + 64, (uint64_t)ctime);
    return memcmp(text, recorded, STAMP_LEN) == 0;
}

typedef struct {
    /* The names' encoded bytes and the recorded texts, a reference each: the loop reads them
     * without the interpreter's lock, while another thread could drop the lists' own. */
    PyObject **held;
    PyObject **texts;
    const char **names;
    const char **recorded;
    char *same;
} Work;

static void work_free(Work *w, Py_ssize_t n) {
    if (w->held != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_XDECREF(w->held[i]);
        }
    }
    if (w->texts != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_XDECREF(w->texts[i]);
        }
    }
    PyMem_Free(w->held);
    PyMem_Free(w->texts);
    PyMem_Free(w->names);
    PyMem_Free(w->recorded);
    PyMem_Free(w->same);
}

/* The names to look at, as the file system's bytes (os.fsencode's), each with its recorded text;
 * a name without a fingerprint, or one no stat can take (a NUL in it), is left out: not the same.
 * 0 with an exception set when a name is not a str or memory runs out. */
static int prepare(Work *w, PyObject *names, PyObject *recorded, Py_ssize_t n) {
    Py_ssize_t slots = n ? n : 1;
    w->held = PyMem_Calloc(slots, sizeof(PyObject *));
    w->texts = PyMem_Calloc(slots, sizeof(PyObject *));
    w->names = PyMem_Calloc(slots, sizeof(char *));
    w->recorded = PyMem_Calloc(slots, sizeof(char *));
    w->same = PyMem_Calloc(slots, 1);
    if (w->held == NULL || w->texts == NULL || w->names == NULL || w->recorded == NULL || w->same == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyList_GET_ITEM(names, i), *known = PyList_GET_ITEM(recorded, i);
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "matches: a name is not a str");
            return 0;
        }
        if (!PyUnicode_Check(known) || !PyUnicode_IS_ASCII(known) || PyUnicode_GET_LENGTH(known) != STAMP_LEN) {
            continue;
        }
        PyObject *encoded = PyUnicode_EncodeFSDefault(name);
        if (encoded == NULL) { /* not encodable: fingerprint.py's own stat says why */
            PyErr_Clear();
            continue;
        }
        w->held[i] = encoded;
        if ((size_t)PyBytes_GET_SIZE(encoded) != strlen(PyBytes_AS_STRING(encoded))) {
            continue;
        }
        w->names[i] = PyBytes_AS_STRING(encoded);
        w->texts[i] = Py_NewRef(known);
        w->recorded[i] = (const char *)PyUnicode_1BYTE_DATA(known);
    }
    return 1;
}

static PyObject *matches(PyObject *Py_UNUSED(self), PyObject *args) {
    int dir_fd;
    PyObject *names, *recorded, *result = NULL;
    Work w = {NULL, NULL, NULL, NULL, NULL};
    if (!PyArg_ParseTuple(args, "iO!O!:matches", &dir_fd, &PyList_Type, &names, &PyList_Type, &recorded)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(names);
    if (PyList_GET_SIZE(recorded) != n) {
        PyErr_SetString(PyExc_ValueError, "matches: names and recorded differ in length");
        return NULL;
    }
    if (prepare(&w, names, recorded, n)) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            if (w.names[i] != NULL) {
                w.same[i] = (char)same_stamp(dir_fd, w.names[i], w.recorded[i]);
            }
        }
        Py_END_ALLOW_THREADS
        result = PyList_New(n);
        for (Py_ssize_t i = 0; result != NULL && i < n; i++) {
            PyList_SET_ITEM(result, i, Py_NewRef(w.same[i] ? Py_True : Py_False));
        }
    }
    work_free(&w, n);
    return result;
}

static PyMethodDef methods[] = {
    {"matches", matches, METH_VARARGS,
     "matches(dir_fd, names, recorded) -> list[bool]: per name, whether its lstat in the open directory "
     "dir_fd reads as its recorded fingerprint (a str of fingerprint.stamp's, or None: not the same)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_stamps",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__stamps(void) { return PyModule_Create(&module); }
