/* tinyhal.hal.native._core: the hot objects' fields and constructors, and the ready path
 * of semaphores, fences and the transient ring.
 *
 * Base types hold the state of Python classes, which subclass them and keep every rare
 * path: `SemaphoreCore` (hal.semaphore.Semaphore: timepoints, offers, blocking and trio
 * waits and failure stay in Python), `FenceCore` (Fence), `StorageCore` (hal.buffer.Storage),
 * `BufferCore` (Buffer), `BufferViewCore` (hal.buffer_view.BufferView) and `RingCore`
 * (hal.ringbuffer.TransientRingbuffer: parked requests, grants, close and collection stay
 * in Python); `RingStorage`, `HeapCounter` and `RingBlock` are plain C types.
 *
 * One way to build each: a base type's constructor (its tp_new, through one `*_make`
 * function where C builds them too) is the only code that sets its fields; the Python
 * subclasses define no `__init__` or `__new__` (Storage's `__init__` fills a block it
 * allocates), and C never writes a Python object's `__slots__`. What is here is what a
 * ready queue operation pays for on every call: a semaphore advanced while nothing waits
 * on it, the one-point fence `hal.fence.create` makes, a join, the check that a wait
 * fence is already reached, a transient block placed or retired with its counters, and
 * `WorkQueue.complete` while nothing waits.
 *
 * Atomicity. The fast paths rely on the GIL: each runs as one C call that never releases it
 * and calls no Python code between its checks and its writes, so no Python thread can run in
 * between. The Python slow paths keep the semaphore's protocol race-free against that: a
 * waiter registers itself (a timepoint, an offer, a blocked thread) under the semaphore's
 * lock *before* it reads the value, and `advance` takes the fast path only when nobody is
 * registered, else it hands over to the locked Python path. A free-threaded interpreter
 * would break this, so the module refuses to build for one. The ring is different: its
 * state changes only under the allocator's lock (a Python lock, taken here through its
 * own methods), as the allocator's Python code changes the counters under it too.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#ifdef Py_GIL_DISABLED
#error "tinyhal's _core relies on the GIL for its fast paths: no free-threaded build"
#endif

#ifndef TINYHAL_CORE_NAME
#define TINYHAL_CORE_NAME _core
#endif
#define CORE_CAT2(a, b) a##b
#define CORE_CAT(a, b) CORE_CAT2(a, b)
#define CORE_STR2(a) #a
#define CORE_STR(a) CORE_STR2(a)

/* The slots every base type here shares: a GC type Python subclasses, with weak
 * references, whose `prefix`_dealloc/_traverse/_clear handle `object`'s fields. */
#define CORE_BASE_TYPE(name, object, prefix, doc)                                       \
    PyVarObject_HEAD_INIT(NULL, 0)                                                      \
    .tp_name = "tinyhal.hal.native._core." name, .tp_basicsize = sizeof(object),        \
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,          \
    .tp_doc = doc, .tp_new = prefix##_new, .tp_dealloc = (destructor)prefix##_dealloc,  \
    .tp_traverse = (traverseproc)prefix##_traverse, .tp_clear = (inquiry)prefix##_clear, \
    .tp_weaklistoffset = offsetof(object, weakrefs)

/* What `register` hands over from Python, its one registration point: the Python
 * classes whose instances C makes (Semaphore, Fence, Buffer), and the Python paths of
 * `normalize_wait_signal` and `complete` for what the fast paths do not take. Each is
 * built only through its type's one constructor function here (`semaphore_make`,
 * `fence_make`, `buffer_make`), which the class's own `__new__` also calls. */
static PyTypeObject *semaphore_class;
static PyTypeObject *fence_class;
static PyTypeObject *buffer_class;
static PyObject *normalize_general;
static PyObject *complete_slow;
static PyObject *allocate_lock;
static PyObject *empty_tuple;
static PyObject *empty_str;
static PyObject *empty_view; /* a byte memoryview of no bytes: the memory of a storage not placed */
static PyObject *zero, *one;
static PyObject *str_advance_slow, *str_collected;

/* IREE's values (iree_hal_memory_access_t ALL, iree_hal_encoding_type_t
 * DENSE_ROW_MAJOR; hal.types), the defaults of Buffer's and BufferView's constructors. */
#define MEMORY_ACCESS_ALL 7
#define ENCODING_DENSE_ROW_MAJOR 1

/* Raises tinyhal.errors.`name`(message) (message stolen; NULL passes its error on). The
 * errors module imports nothing of the HAL, so importing it here when first needed makes
 * no cycle. */
static PyObject *raise_error(const char *name, PyObject *message)
{
    if (message == NULL)
        return NULL;
    PyObject *errors = PyImport_ImportModule("tinyhal.errors");
    PyObject *cls = errors == NULL ? NULL : PyObject_GetAttrString(errors, name);
    Py_XDECREF(errors);
    if (cls != NULL) {
        PyObject *error = PyObject_CallOneArg(cls, message);
        if (error != NULL) {
            PyErr_SetObject(cls, error);
            Py_DECREF(error);
        }
        Py_DECREF(cls);
    }
    Py_DECREF(message);
    return NULL;
}

/* `value` as a timeline value (an int in [0, 2**64)): 0 and *out set, or -1 (no error
 * set) when it is not one. */
static int timeline_value(PyObject *value, unsigned long long *out)
{
    if (!PyLong_Check(value))
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    *out = v;
    return 0;
}

static PyObject *invalid_timeline_value(const char *what, PyObject *value)
{
    return raise_error("InvalidArgumentError",
                       PyUnicode_FromFormat("semaphore %s must be an int in [0, 2**64), not %R",
                                            what, value));
}

/* The dealloc of the GC types here: untrack, clear weak references (if any were made)
 * and fields, free. */
static void gc_dealloc(PyObject *self, PyObject *weakrefs, inquiry clear)
{
    PyObject_GC_UnTrack(self);
    if (weakrefs != NULL)
        PyObject_ClearWeakRefs(self);
    clear(self);
    Py_TYPE(self)->tp_free(self);
}

/* A base type's traverse and clear over the object fields `FIELDS` lists, and its
 * dealloc through `clear`. */
#define CORE_TRAVERSE_AND_CLEAR(prefix, object, FIELDS)                                  \
    static int prefix##_traverse(object *self, visitproc visit, void *arg)               \
    {                                                                                    \
        FIELDS(Py_VISIT)                                                                 \
        return 0;                                                                        \
    }                                                                                    \
    static int prefix##_clear(object *self)                                              \
    {                                                                                    \
        FIELDS(Py_CLEAR)                                                                 \
        return 0;                                                                        \
    }
#define CORE_DEALLOC(prefix, object, clear)                                              \
    static void prefix##_dealloc(object *self)                                           \
    {                                                                                    \
        gc_dealloc((PyObject *)self, self->weakrefs, (inquiry)clear);                    \
    }

/* ---------------------------------------------------------------------------------- */
/* SemaphoreCore                                                                      */

typedef struct {
    PyObject_HEAD
    unsigned long long value;
    PyObject *failure;    /* NULL, or the Error it failed with */
    PyObject *lock;       /* NULL until a slow path asks for `_lock` */
    PyObject *cond;       /* NULL until a blocking wait makes one */
    PyObject *timepoints; /* () or a heap list */
    PyObject *offers;     /* () or a heap list */
    Py_ssize_t blocked;   /* threads inside `wait` */
    PyObject *name;
    PyObject *weakrefs;
} SemaphoreObject;

static PyTypeObject SemaphoreCoreType;

static inline int is_empty_sequence(PyObject *o)
{
    return (PyTuple_CheckExact(o) || PyList_CheckExact(o)) && Py_SIZE(o) == 0;
}

/* The one constructor of a semaphore: `Semaphore(initial, name)` and every semaphore C
 * makes come here. */
static PyObject *semaphore_make(PyTypeObject *type, unsigned long long value, PyObject *name)
{
    SemaphoreObject *self = (SemaphoreObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->value = value;
    self->timepoints = Py_NewRef(empty_tuple);
    self->offers = Py_NewRef(empty_tuple);
    self->name = Py_NewRef(name);
    return (PyObject *)self;
}

static PyObject *semaphore_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"initial", "name", NULL};
    PyObject *initial = NULL, *name = empty_str;
    unsigned long long value = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:Semaphore", kwlist, &initial, &name))
        return NULL;
    if (initial != NULL && timeline_value(initial, &value) < 0)
        return invalid_timeline_value("initial value", initial);
    return semaphore_make(type, value, name);
}

/* The object fields of a SemaphoreObject, for traverse and clear. */
#define SEMAPHORE_OBJECT_FIELDS(X) \
    X(self->failure); X(self->lock); X(self->cond); X(self->timepoints); \
    X(self->offers); X(self->name);

CORE_TRAVERSE_AND_CLEAR(semaphore, SemaphoreObject, SEMAPHORE_OBJECT_FIELDS)

/* A Python subclass's own dealloc and traverse handle its (heap) type; these handle only
 * the fields. */
CORE_DEALLOC(semaphore, SemaphoreObject, semaphore_clear)

/* The failure as the current exception. */
static PyObject *raise_failure(PyObject *failure)
{
    PyErr_SetObject((PyObject *)Py_TYPE(failure), failure);
    return NULL;
}

/* The fast path of `advance`: 1 if it advanced `self` to `value`, 0 if the caller must
 * take the slow path (nothing changed), never an error. */
static int semaphore_advance_fast(SemaphoreObject *self, PyObject *value)
{
    if (!PyLong_CheckExact(value) || self->failure != NULL || self->blocked != 0
        || !is_empty_sequence(self->timepoints) || !is_empty_sequence(self->offers))
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (v <= self->value)
        return 0;
    self->value = v;
    return 1;
}

static PyObject *semaphore_advance_slow(PyObject *self, PyObject *value)
{
    return PyObject_CallMethodOneArg(self, str_advance_slow, value);
}

static PyObject *semaphore_advance(SemaphoreObject *self, PyObject *value)
{
    if (semaphore_advance_fast(self, value)) {
        Py_INCREF(empty_tuple);
        return empty_tuple;
    }
    return semaphore_advance_slow((PyObject *)self, value);
}

static PyObject *semaphore_query(SemaphoreObject *self, PyObject *unused)
{
    if (self->failure != NULL)
        return raise_failure(self->failure);
    return PyLong_FromUnsignedLongLong(self->value);
}

static PyObject *semaphore_get_value(SemaphoreObject *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(self->value);
}

static int semaphore_set_value(SemaphoreObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a semaphore's value cannot be deleted");
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    self->value = v;
    return 0;
}

/* Made on first use: most semaphores never take a slow path. The check after the call
 * keeps one lock per semaphore even if making it ran other threads (a collection). */
static PyObject *semaphore_get_lock(SemaphoreObject *self, void *closure)
{
    if (self->lock == NULL) {
        PyObject *lock = PyObject_CallNoArgs(allocate_lock);
        if (lock == NULL)
            return NULL;
        if (self->lock == NULL)
            self->lock = lock;
        else
            Py_DECREF(lock);
    }
    Py_INCREF(self->lock);
    return self->lock;
}

static PyMethodDef semaphore_methods[] = {
    {"advance", (PyCFunction)semaphore_advance, METH_O,
     "advance(value) -> timepoints reached (see hal.semaphore.Semaphore.advance)"},
    {"query", (PyCFunction)semaphore_query, METH_NOARGS,
     "The current value; raises the failure if the semaphore has failed."},
    {NULL},
};

static PyMemberDef semaphore_members[] = {
    {"_failure", T_OBJECT, offsetof(SemaphoreObject, failure), 0, NULL},
    {"_cond", T_OBJECT, offsetof(SemaphoreObject, cond), 0, NULL},
    {"_timepoints", T_OBJECT_EX, offsetof(SemaphoreObject, timepoints), 0, NULL},
    {"_offers", T_OBJECT_EX, offsetof(SemaphoreObject, offers), 0, NULL},
    {"_blocked", T_PYSSIZET, offsetof(SemaphoreObject, blocked), 0, NULL},
    {"name", T_OBJECT_EX, offsetof(SemaphoreObject, name), 0, NULL},
    {NULL},
};

static PyGetSetDef semaphore_getset[] = {
    {"_value", (getter)semaphore_get_value, (setter)semaphore_set_value, NULL, NULL},
    {"_lock", (getter)semaphore_get_lock, NULL, NULL, NULL},
    {NULL},
};

static PyTypeObject SemaphoreCoreType = {
    CORE_BASE_TYPE("SemaphoreCore", SemaphoreObject, semaphore,
                   "The state of a timeline semaphore and its fast paths "
                   "(hal.semaphore.Semaphore)."),
    .tp_methods = semaphore_methods,
    .tp_members = semaphore_members,
    .tp_getset = semaphore_getset,
};

/* ---------------------------------------------------------------------------------- */
/* FenceCore                                                                          */

typedef struct {
    PyObject_HEAD
    PyObject *points;   /* a tuple of (Semaphore, int), one per semaphore */
    PyObject *timeline; /* NULL until asked: the points as a dict */
    PyObject *weakrefs;
} FenceObject;

static PyTypeObject FenceCoreType;

/* The one constructor of a fence: of the tuple `points` (stolen), already one point per
 * semaphore, and the same points as a dict (`timeline`, stolen) or NULL. `Fence(points)`,
 * `Fence.single`, and every fence C makes come here. */
static PyObject *fence_make(PyTypeObject *type, PyObject *points, PyObject *timeline)
{
    FenceObject *self = (FenceObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(points);
        Py_XDECREF(timeline);
        return NULL;
    }
    self->points = points;
    self->timeline = timeline;
    return (PyObject *)self;
}

/* A fence of `timeline`'s points (stolen), in its order. */
static PyObject *fence_of_timeline(PyTypeObject *type, PyObject *timeline)
{
    Py_ssize_t n = PyDict_GET_SIZE(timeline), pos = 0, i = 0;
    PyObject *points = PyTuple_New(n), *sem, *value;
    if (points == NULL) {
        Py_DECREF(timeline);
        return NULL;
    }
    while (PyDict_Next(timeline, &pos, &sem, &value)) {
        PyObject *point = PyTuple_Pack(2, sem, value);
        if (point == NULL) {
            Py_DECREF(points);
            Py_DECREF(timeline);
            return NULL;
        }
        PyTuple_SET_ITEM(points, i++, point);
    }
    return fence_make(type, points, timeline);
}

/* Puts `value` for `sem` into `timeline` unless it holds a larger or equal one. */
static int timeline_keep_largest(PyObject *timeline, PyObject *sem, PyObject *value)
{
    PyObject *old = PyDict_GetItemWithError(timeline, sem);
    if (old == NULL && PyErr_Occurred())
        return -1;
    if (old != NULL) {
        int larger = PyObject_RichCompareBool(value, old, Py_GT);
        if (larger <= 0)
            return larger;
    }
    return PyDict_SetItem(timeline, sem, value);
}

/* `Fence(points=())`: each (semaphore, value) pair checked, a semaphore kept once at the
 * largest value given for it, in the order first given. */
static PyObject *fence_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"points", NULL};
    PyObject *points = empty_tuple;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:Fence", kwlist, &points))
        return NULL;
    PyObject *iterator = PyObject_GetIter(points);
    if (iterator == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return NULL;
        PyErr_Clear();
        return raise_error("InvalidArgumentError",
                           PyUnicode_FromFormat("fence points must be an iterable of "
                                                "(Semaphore, value) pairs, not %R", points));
    }
    PyObject *timeline = PyDict_New(), *item;
    if (timeline == NULL) {
        Py_DECREF(iterator);
        return NULL;
    }
    while ((item = PyIter_Next(iterator)) != NULL) {
        PyObject *pair = PyTuple_CheckExact(item) ? Py_NewRef(item) : PySequence_Tuple(item);
        int failed = 1;
        unsigned long long v;
        if (pair == NULL && !PyErr_ExceptionMatches(PyExc_TypeError)) {
            Py_DECREF(item);
            break;
        }
        if (pair == NULL || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Clear();
            raise_error("InvalidArgumentError",
                        PyUnicode_FromFormat("fence points must be (Semaphore, value) pairs, "
                                             "not %R", item));
        } else if (timeline_value(PyTuple_GET_ITEM(pair, 1), &v) < 0) {
            invalid_timeline_value("fence value", PyTuple_GET_ITEM(pair, 1));
        } else {
            failed = timeline_keep_largest(timeline, PyTuple_GET_ITEM(pair, 0),
                                           PyTuple_GET_ITEM(pair, 1)) < 0;
        }
        Py_XDECREF(pair);
        Py_DECREF(item);
        if (failed)
            break;
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred()) {
        Py_DECREF(timeline);
        return NULL;
    }
    return fence_of_timeline(type, timeline);
}

static PyObject *fence_single(PyTypeObject *type, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long v;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "Fence.single(semaphore, value)");
        return NULL;
    }
    if (timeline_value(args[1], &v) < 0)
        return invalid_timeline_value("fence value", args[1]);
    PyObject *point = PyTuple_Pack(2, args[0], args[1]);
    if (point == NULL)
        return NULL;
    PyObject *points = PyTuple_Pack(1, point);
    Py_DECREF(point);
    if (points == NULL)
        return NULL;
    return fence_make(type, points, NULL);
}

/* The object fields of a FenceObject, for traverse and clear. */
#define FENCE_OBJECT_FIELDS(X) \
    X(self->points); X(self->timeline);

CORE_TRAVERSE_AND_CLEAR(fence, FenceObject, FENCE_OBJECT_FIELDS)

CORE_DEALLOC(fence, FenceObject, fence_clear)

static PyObject *fence_get_timeline(FenceObject *self, void *closure)
{
    if (self->timeline == NULL) {
        PyObject *timeline = PyDict_New();
        if (timeline == NULL)
            return NULL;
        Py_ssize_t n = PyTuple_GET_SIZE(self->points);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *point = PyTuple_GET_ITEM(self->points, i);
            if (!PyTuple_Check(point) || PyTuple_GET_SIZE(point) != 2) {
                Py_DECREF(timeline);
                PyErr_SetString(PyExc_TypeError, "fence points must be (Semaphore, value) pairs");
                return NULL;
            }
            if (PyDict_SetItem(timeline, PyTuple_GET_ITEM(point, 0),
                               PyTuple_GET_ITEM(point, 1)) < 0) {
                Py_DECREF(timeline);
                return NULL;
            }
        }
        if (self->timeline == NULL)
            self->timeline = timeline;
        else
            Py_DECREF(timeline);
    }
    Py_INCREF(self->timeline);
    return self->timeline;
}

static int fence_set_timeline(FenceObject *self, PyObject *value, void *closure)
{
    if (value != NULL && !PyDict_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "a fence's timeline is a dict");
        return -1;
    }
    Py_XINCREF(value);
    Py_XSETREF(self->timeline, value);
    return 0;
}

static PyObject *fence_get_points(FenceObject *self, void *closure)
{
    Py_INCREF(self->points);
    return self->points;
}

static Py_ssize_t fence_length(FenceObject *self)
{
    return PyTuple_GET_SIZE(self->points);
}

static PySequenceMethods fence_as_sequence = {
    .sq_length = (lenfunc)fence_length,
};

static PyGetSetDef fence_getset[] = {
    {"timeline", (getter)fence_get_timeline, (setter)fence_set_timeline,
     "Each semaphore of the fence and the value it must reach (read it).", NULL},
    {"_points", (getter)fence_get_points, NULL, NULL, NULL},
    {NULL},
};

static PyMethodDef fence_methods[] = {
    {"single", (PyCFunction)(void (*)(void))fence_single, METH_FASTCALL | METH_CLASS,
     "Fence.single(semaphore, value): a fence of one point."},
    {NULL},
};

static PyTypeObject FenceCoreType = {
    CORE_BASE_TYPE("FenceCore", FenceObject, fence,
                   "The points of a fence (hal.semaphore.Fence): a tuple, and a dict made "
                   "when asked. Fence(points) builds it; it never changes after."),
    .tp_as_sequence = &fence_as_sequence,
    .tp_methods = fence_methods,
    .tp_getset = fence_getset,
};

/* ---------------------------------------------------------------------------------- */
/* StorageCore, RingStorage, BufferCore, BufferViewCore: the memory objects             */

/* The fields of a block of memory (hal.buffer.Storage, whose `__init__` fills them for a
 * block it allocates or adopts). Object members (T_OBJECT_EX), read and written from
 * Python as fast as `__slots__`. */
typedef struct {
    PyObject_HEAD
    PyObject *array;       /* the block as a flat byte memoryview */
    PyObject *address;     /* its address, an int */
    PyObject *byte_length;
    PyObject *released;    /* True once released: use after that is refused */
    PyObject *on_release;  /* CountedStorage's callback, or None */
    PyObject *weakrefs;
} StorageObject;

/* A transient buffer's storage: no memory until its alloca is granted a ring block,
 * then `ring` and `block` while it holds one. */
typedef struct {
    StorageObject base;
    PyObject *ring, *block;
} RingStorageObject;

static PyTypeObject StorageCoreType, RingStorageType;

static void storage_set_fields(StorageObject *self, PyObject *byte_length)
{
    self->array = Py_NewRef(empty_view);
    self->address = Py_NewRef(zero);
    self->byte_length = Py_NewRef(byte_length);
    self->released = Py_NewRef(Py_False);
    self->on_release = Py_NewRef(Py_None);
}

static PyObject *storage_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    StorageObject *self = (StorageObject *)type->tp_alloc(type, 0);
    if (self != NULL)
        storage_set_fields(self, zero);
    return (PyObject *)self;
}

#define STORAGE_OBJECT_FIELDS(X) \
    X(self->array); X(self->address); X(self->byte_length); X(self->released); \
    X(self->on_release);

CORE_TRAVERSE_AND_CLEAR(storage, StorageObject, STORAGE_OBJECT_FIELDS)
CORE_DEALLOC(storage, StorageObject, storage_clear)

static PyObject *storage_release(StorageObject *self, PyObject *unused)
{
    Py_SETREF(self->released, Py_NewRef(Py_True));
    Py_RETURN_NONE;
}

static PyMethodDef storage_methods[] = {
    {"release", (PyCFunction)storage_release, METH_NOARGS,
     "Marks the block dead now (use after release is then refused)."},
    {NULL},
};

static PyMemberDef storage_members[] = {
    {"array", T_OBJECT_EX, offsetof(StorageObject, array), 0, NULL},
    {"address", T_OBJECT_EX, offsetof(StorageObject, address), 0, NULL},
    {"byte_length", T_OBJECT_EX, offsetof(StorageObject, byte_length), 0, NULL},
    {"released", T_OBJECT_EX, offsetof(StorageObject, released), 0, NULL},
    {"_on_release", T_OBJECT_EX, offsetof(StorageObject, on_release), 0, NULL},
    {NULL},
};

static PyTypeObject StorageCoreType = {
    CORE_BASE_TYPE("StorageCore", StorageObject, storage,
                   "The fields of a block of memory (hal.buffer.Storage)."),
    .tp_methods = storage_methods,
    .tp_members = storage_members,
};

/* The one constructor of a RingStorage: `RingStorage(byte_length)` and the ring's
 * `commit_new` come here. */
static PyObject *ring_storage_make(PyObject *byte_length)
{
    RingStorageObject *self =
        (RingStorageObject *)RingStorageType.tp_alloc(&RingStorageType, 0);
    if (self == NULL)
        return NULL;
    storage_set_fields(&self->base, byte_length);
    self->ring = Py_NewRef(Py_None);
    self->block = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static PyObject *ring_storage_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *byte_length;
    if (!PyArg_ParseTuple(args, "O:RingStorage", &byte_length))
        return NULL;
    return ring_storage_make(byte_length);
}

static int ring_storage_traverse(RingStorageObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ring);
    Py_VISIT(self->block);
    return storage_traverse(&self->base, visit, arg);
}

static int ring_storage_clear(RingStorageObject *self)
{
    Py_CLEAR(self->ring);
    Py_CLEAR(self->block);
    return storage_clear(&self->base);
}

/* A storage that dies still holding its block hands it back (`ring.collected(block)`),
 * so a transient buffer dropped without its dealloca cannot wedge the ring. */
static void ring_storage_finalize(RingStorageObject *self)
{
    if (self->block == NULL || self->block == Py_None || self->ring == NULL)
        return;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *done = PyObject_CallMethodOneArg(self->ring, str_collected, self->block);
    if (done == NULL)
        PyErr_WriteUnraisable((PyObject *)self);
    Py_XDECREF(done);
    PyErr_Restore(type, value, traceback);
}

static void ring_storage_dealloc(RingStorageObject *self)
{
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0)
        return; /* resurrected */
    gc_dealloc((PyObject *)self, self->base.weakrefs, (inquiry)ring_storage_clear);
}

static PyMemberDef ring_storage_members[] = {
    {"ring", T_OBJECT_EX, offsetof(RingStorageObject, ring), 0, NULL},
    {"block", T_OBJECT_EX, offsetof(RingStorageObject, block), 0, NULL},
    {NULL},
};

static PyTypeObject RingStorageType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tinyhal.hal.native._core.RingStorage",
    .tp_basicsize = sizeof(RingStorageObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "RingStorage(byte_length): the storage of a transient buffer: no memory until "
              "its queue_alloca runs, then a block of a transient ring (hal.ringbuffer), "
              "which sets `ring` and `block` while the storage holds it. One that dies "
              "still holding its block hands it back (`ring.collected(block)`).",
    .tp_base = &StorageCoreType,
    .tp_new = ring_storage_new,
    .tp_dealloc = (destructor)ring_storage_dealloc,
    .tp_traverse = (traverseproc)ring_storage_traverse,
    .tp_clear = (inquiry)ring_storage_clear,
    .tp_finalize = (destructor)ring_storage_finalize,
    .tp_members = ring_storage_members,
};

/* The fields of a buffer (hal.buffer.Buffer): read-only once made. */
typedef struct {
    PyObject_HEAD
    PyObject *allocator, *storage, *byte_offset, *byte_length;
    PyObject *memory_type_bits, *usage_bits, *access_bits; /* exact ints */
    PyObject *weakrefs;
} BufferObject;

static PyTypeObject BufferCoreType;

/* `value` as an exact int (an IntFlag's value), a new reference. */
static PyObject *exact_int(PyObject *value)
{
    return PyLong_CheckExact(value) ? Py_NewRef(value) : PyNumber_Index(value);
}

/* The one constructor of a buffer: `Buffer(...)` (its `__new__`) and the ring's
 * `commit_new` come here. The bit sets may be IntFlags; they are kept as exact ints. */
static PyObject *buffer_make(PyTypeObject *type, PyObject *allocator, PyObject *storage,
                             PyObject *byte_offset, PyObject *byte_length,
                             PyObject *memory_type, PyObject *usage, PyObject *access)
{
    PyObject *memory_type_bits = exact_int(memory_type);
    PyObject *usage_bits = memory_type_bits == NULL ? NULL : exact_int(usage);
    PyObject *access_bits = usage_bits == NULL ? NULL : exact_int(access);
    BufferObject *self = access_bits == NULL ? NULL
                                             : (BufferObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_XDECREF(memory_type_bits);
        Py_XDECREF(usage_bits);
        Py_XDECREF(access_bits);
        return NULL;
    }
    self->allocator = Py_NewRef(allocator);
    self->storage = Py_NewRef(storage);
    self->byte_offset = Py_NewRef(byte_offset);
    self->byte_length = Py_NewRef(byte_length);
    self->memory_type_bits = memory_type_bits;
    self->usage_bits = usage_bits;
    self->access_bits = access_bits;
    return (PyObject *)self;
}

static PyObject *memory_access_all;

static PyObject *buffer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"allocator", "storage", "byte_offset", "byte_length",
                             "memory_type", "allowed_usage", "allowed_access", NULL};
    PyObject *allocator, *storage, *byte_offset, *byte_length, *memory_type, *usage;
    PyObject *access = memory_access_all;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO|O:Buffer", kwlist, &allocator,
                                     &storage, &byte_offset, &byte_length, &memory_type,
                                     &usage, &access))
        return NULL;
    return buffer_make(type, allocator, storage, byte_offset, byte_length, memory_type, usage,
                       access);
}

#define BUFFER_OBJECT_FIELDS(X) \
    X(self->allocator); X(self->storage); X(self->byte_offset); X(self->byte_length); \
    X(self->memory_type_bits); X(self->usage_bits); X(self->access_bits);

CORE_TRAVERSE_AND_CLEAR(buffer, BufferObject, BUFFER_OBJECT_FIELDS)
CORE_DEALLOC(buffer, BufferObject, buffer_clear)

static PyMemberDef buffer_members[] = {
    {"allocator", T_OBJECT_EX, offsetof(BufferObject, allocator), READONLY, NULL},
    {"storage", T_OBJECT_EX, offsetof(BufferObject, storage), READONLY, NULL},
    {"byte_offset", T_OBJECT_EX, offsetof(BufferObject, byte_offset), READONLY, NULL},
    {"byte_length", T_OBJECT_EX, offsetof(BufferObject, byte_length), READONLY, NULL},
    {"memory_type_bits", T_OBJECT_EX, offsetof(BufferObject, memory_type_bits), READONLY, NULL},
    {"usage_bits", T_OBJECT_EX, offsetof(BufferObject, usage_bits), READONLY, NULL},
    {"access_bits", T_OBJECT_EX, offsetof(BufferObject, access_bits), READONLY, NULL},
    {NULL},
};

static PyTypeObject BufferCoreType = {
    CORE_BASE_TYPE("BufferCore", BufferObject, buffer,
                   "The fields of a buffer (hal.buffer.Buffer), set once by its constructor."),
    .tp_members = buffer_members,
};

/* The fields of a buffer view (hal.buffer_view.BufferView): read-only once made. */
typedef struct {
    PyObject_HEAD
    PyObject *buffer, *shape, *element_type, *encoding_type;
} BufferViewObject;

/* The dimensions as a tuple of exact ints (any iterable of what int() takes). */
static PyObject *shape_tuple(PyObject *shape)
{
    PyObject *items = PySequence_Fast(shape, "not a sequence");
    if (items == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    PyObject *dims = PyTuple_New(n);
    for (Py_ssize_t i = 0; dims != NULL && i < n; i++) {
        PyObject *dim = PyNumber_Long(PySequence_Fast_GET_ITEM(items, i));
        if (dim == NULL)
            Py_CLEAR(dims);
        else
            PyTuple_SET_ITEM(dims, i, dim);
    }
    Py_DECREF(items);
    return dims;
}

/* The bytes a dense row-major tensor of `dims` needs (sub-byte elements packed), as an
 * int object (exact also past 64 bits, for the error message). */
static PyObject *dense_bytes(PyObject *dims, unsigned bits)
{
    PyObject *total = PyLong_FromUnsignedLong(bits);
    Py_ssize_t n = PyTuple_GET_SIZE(dims);
    for (Py_ssize_t i = 0; total != NULL && i < n; i++)
        Py_SETREF(total, PyNumber_Multiply(total, PyTuple_GET_ITEM(dims, i)));
    if (total == NULL)
        return NULL;
    PyObject *seven = PyLong_FromLong(7), *eight = PyLong_FromLong(8);
    PyObject *rounded = seven == NULL ? NULL : PyNumber_Add(total, seven);
    PyObject *bytes = rounded == NULL || eight == NULL ? NULL
                                                       : PyNumber_FloorDivide(rounded, eight);
    Py_DECREF(total);
    Py_XDECREF(seven);
    Py_XDECREF(eight);
    Py_XDECREF(rounded);
    return bytes;
}

/* 1 if a dense tensor of `dims` (no negative dimension) with `bits`-bit elements fits in
 * `available` bytes, 0 if not, -1 on error; in 64-bit arithmetic unless it overflows. */
static int dense_fits(PyObject *dims, unsigned bits, PyObject *available)
{
    long long have = PyLong_AsLongLong(available);
    if (have == -1 && PyErr_Occurred())
        return -1;
    unsigned long long total = bits;
    Py_ssize_t n = PyTuple_GET_SIZE(dims);
    int overflow = 0;
    for (Py_ssize_t i = 0; i < n && !overflow; i++) {
        unsigned long long dim = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(dims, i));
        if (dim == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            overflow = 1;
        } else {
            overflow = __builtin_mul_overflow(total, dim, &total);
        }
    }
    if (overflow) { /* rare: Python arithmetic decides */
        PyObject *needed = dense_bytes(dims, bits);
        if (needed == NULL)
            return -1;
        int fits = PyObject_RichCompareBool(needed, available, Py_LE);
        Py_DECREF(needed);
        return fits;
    }
    return total / 8 + (total % 8 != 0) <= (unsigned long long)(have < 0 ? 0 : have);
}

/* The one constructor of a buffer view, checking what IREE's
 * iree_hal_buffer_view_create checks: a Buffer, no negative dimension, and enough bytes
 * for the shape and element type. */
static PyObject *buffer_view_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buffer", "shape", "element_type", "encoding_type", NULL};
    PyObject *buffer, *shape, *element_type_arg, *encoding_type_arg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|O:BufferView", kwlist, &buffer, &shape,
                                     &element_type_arg, &encoding_type_arg))
        return NULL;
    if (!PyObject_TypeCheck(buffer, &BufferCoreType))
        return raise_error("InvalidArgumentError",
                           PyUnicode_FromFormat("a buffer view needs a Buffer, not %R", buffer));
    PyObject *dims = PyTuple_CheckExact(shape) ? Py_NewRef(shape) : NULL;
    Py_ssize_t n = dims == NULL ? 0 : PyTuple_GET_SIZE(dims);
    for (Py_ssize_t i = 0; dims != NULL && i < n; i++)
        if (!PyLong_CheckExact(PyTuple_GET_ITEM(dims, i)))
            Py_CLEAR(dims);
    if (dims == NULL && (dims = shape_tuple(shape)) == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError))
            return NULL;
        PyErr_Clear();
        return raise_error("InvalidArgumentError",
                           PyUnicode_FromFormat("buffer view shape %R is not a sequence of ints",
                                                shape));
    }
    n = PyTuple_GET_SIZE(dims);
    for (Py_ssize_t i = 0; i < n; i++) {
        int negative = PyObject_RichCompareBool(PyTuple_GET_ITEM(dims, i), zero, Py_LT);
        if (negative < 0) {
            Py_DECREF(dims);
            return NULL;
        }
        if (negative) {
            raise_error("InvalidArgumentError",
                        PyUnicode_FromFormat("buffer view shape %R has a negative dimension",
                                             dims));
            Py_DECREF(dims);
            return NULL;
        }
    }
    PyObject *element_type = exact_int(element_type_arg);
    PyObject *encoding_type = element_type == NULL ? NULL
                              : encoding_type_arg == NULL
                                  ? PyLong_FromLong(ENCODING_DENSE_ROW_MAJOR)
                                  : exact_int(encoding_type_arg);
    if (encoding_type == NULL) {
        Py_DECREF(dims);
        Py_XDECREF(element_type);
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return NULL;
        PyErr_Clear();
        return raise_error("InvalidArgumentError",
                           PyUnicode_FromFormat("buffer view element type %R and encoding type "
                                                "%R must be ints", element_type_arg,
                                                encoding_type_arg ? encoding_type_arg
                                                                  : Py_None));
    }
    unsigned bits = (unsigned)(PyLong_AsUnsignedLongLongMask(element_type) & 0xFF);
    PyObject *available = ((BufferObject *)buffer)->byte_length;
    int fits = PyErr_Occurred() ? -1 : dense_fits(dims, bits, available);
    if (fits == 0) {
        PyObject *needed = dense_bytes(dims, bits);
        if (needed != NULL) {
            char type_hex[24];
            PyOS_snprintf(type_hex, sizeof(type_hex), "0x%08llX",
                          PyLong_AsUnsignedLongLongMask(element_type));
            raise_error("OutOfRangeError",
                        PyUnicode_FromFormat("buffer view of shape %R and element type %s "
                                             "needs %S bytes but the buffer has %S",
                                             dims, type_hex, needed, available));
            Py_DECREF(needed);
        }
    }
    BufferViewObject *self = fits == 1 ? (BufferViewObject *)type->tp_alloc(type, 0) : NULL;
    if (self == NULL) {
        Py_DECREF(dims);
        Py_DECREF(element_type);
        Py_DECREF(encoding_type);
        return NULL;
    }
    self->buffer = Py_NewRef(buffer);
    self->shape = dims;
    self->element_type = element_type;
    self->encoding_type = encoding_type;
    return (PyObject *)self;
}

#define BUFFER_VIEW_OBJECT_FIELDS(X) \
    X(self->buffer); X(self->shape); X(self->element_type); X(self->encoding_type);

CORE_TRAVERSE_AND_CLEAR(buffer_view, BufferViewObject, BUFFER_VIEW_OBJECT_FIELDS)

static void buffer_view_dealloc(BufferViewObject *self)
{
    gc_dealloc((PyObject *)self, NULL, (inquiry)buffer_view_clear);
}

static PyMemberDef buffer_view_members[] = {
    {"buffer", T_OBJECT_EX, offsetof(BufferViewObject, buffer), READONLY, NULL},
    {"shape", T_OBJECT_EX, offsetof(BufferViewObject, shape), READONLY, NULL},
    {"element_type", T_OBJECT_EX, offsetof(BufferViewObject, element_type), READONLY, NULL},
    {"encoding_type", T_OBJECT_EX, offsetof(BufferViewObject, encoding_type), READONLY, NULL},
    {NULL},
};

static PyTypeObject BufferViewCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tinyhal.hal.native._core.BufferViewCore",
    .tp_basicsize = sizeof(BufferViewObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields of a buffer view (hal.buffer_view.BufferView), checked and set "
              "once by its constructor.",
    .tp_new = buffer_view_new,
    .tp_dealloc = (destructor)buffer_view_dealloc,
    .tp_traverse = (traverseproc)buffer_view_traverse,
    .tp_clear = (inquiry)buffer_view_clear,
    .tp_members = buffer_view_members,
};

/* ---------------------------------------------------------------------------------- */
/* HeapCounter, RingBlock and RingCore: the transient ring's bookkeeping               */

/* The bytes of one heap (hal.allocator.HeapCounter). Signed: a counter never goes below
 * zero, but Python code may subtract before it adds. */
typedef struct {
    PyObject_HEAD
    long long live, peak, allocated, freed, count;
} HeapCounterObject;

static PyMemberDef heap_counter_members[] = {
    {"live", T_LONGLONG, offsetof(HeapCounterObject, live), 0, NULL},
    {"peak", T_LONGLONG, offsetof(HeapCounterObject, peak), 0, NULL},
    {"allocated", T_LONGLONG, offsetof(HeapCounterObject, allocated), 0, NULL},
    {"freed", T_LONGLONG, offsetof(HeapCounterObject, freed), 0, NULL},
    {"count", T_LONGLONG, offsetof(HeapCounterObject, count), 0, NULL},
    {NULL},
};

static PyTypeObject HeapCounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tinyhal.hal.native._core.HeapCounter",
    .tp_basicsize = sizeof(HeapCounterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The bytes of one heap, or of all of them: live, peak, allocated, freed, and the "
              "count of allocations. Changed only under Allocator.lock.",
    .tp_new = PyType_GenericNew,
    .tp_members = heap_counter_members,
};

typedef struct {
    PyObject_HEAD
    long long offset, size, requested;
    char retired;
    char starts_run; /* the first block of a run (see RingRun) */
} RingBlockObject;

static PyObject *ring_block_repr(RingBlockObject *self)
{
    return PyUnicode_FromFormat("<RingBlock [%lld, %lld) %s>", self->offset,
                                self->offset + self->size, self->retired ? "retired" : "live");
}

static PyObject *ring_block_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    long long offset, size, requested;
    if (!PyArg_ParseTuple(args, "LLL:RingBlock", &offset, &size, &requested))
        return NULL;
    RingBlockObject *self = (RingBlockObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->offset = offset;
        self->size = size;
        self->requested = requested;
    }
    return (PyObject *)self;
}

static PyMemberDef ring_block_members[] = {
    {"offset", T_LONGLONG, offsetof(RingBlockObject, offset), READONLY, NULL},
    {"size", T_LONGLONG, offsetof(RingBlockObject, size), READONLY, NULL},
    {"requested", T_LONGLONG, offsetof(RingBlockObject, requested), READONLY, NULL},
    {"retired", T_BOOL, offsetof(RingBlockObject, retired), READONLY, NULL},
    {NULL},
};

static PyTypeObject RingBlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tinyhal.hal.native._core.RingBlock",
    .tp_basicsize = sizeof(RingBlockObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One reservation: [offset, offset + size) of the ring (size 64-byte rounded).",
    .tp_new = ring_block_new,
    .tp_repr = (reprfunc)ring_block_repr,
    .tp_members = ring_block_members,
};

#define RING_ALIGNMENT 64

/* The unreclaimed blocks, in allocation order, form at most RING_RUNS runs: each run is
 * contiguous, [start, end) with start the offset of its oldest unreclaimed block and end
 * that of its newest one; the newest run ends at the head. A new block extends the newest
 * run or starts a run in a gap between them. Two runs are the classic wrapped ring; more
 * let a block go elsewhere than behind a tail that outlives its lap. */
#define RING_RUNS 16

typedef struct {
    long long start, end;
} RingRun;

typedef struct {
    PyObject_HEAD
    long long capacity, head, tail, live, peak, reservations, waits, backing_address;
    long long high_water; /* the end of the highest block ever placed: the pages touched */
    PyObject *backing;      /* NULL until the first placement asks `_ensure_backing` */
    PyObject *lock;         /* the allocator's lock: every change happens under it */
    PyObject *lock_acquire, *lock_release, *lock_is_owned; /* its bound methods */
    PyObject *allocator;    /* NULL, or the allocator whose counters change with the ring */
    PyObject *heap_name;
    HeapCounterObject *heap, *total, *device_memory; /* NULL when not counted */
    PyObject *parked;       /* a deque of (size, on_grant) */
    PyObject *closed;       /* NULL, or the error later requests fail with */
    RingBlockObject **blocks; /* live blocks (and retired ones not yet reclaimed), oldest first */
    Py_ssize_t blocks_start, blocks_count, blocks_capacity;
    RingRun runs[RING_RUNS]; /* oldest first; runs_count is 0 exactly when blocks_count is */
    int runs_count;
    PyObject *weakrefs;
} RingObject;

static PyObject *str_ensure_backing, *str_grant_parked, *str_profile;
static PyObject *str_block, *str_ring, *str_array, *str_address, *str_byte_length;

/* A member Python set to None counts as absent. */
static inline int present(PyObject *o)
{
    return o != NULL && o != Py_None;
}

static RingBlockObject *ring_front(RingObject *self)
{
    return self->blocks[self->blocks_start];
}

static int ring_push(RingObject *self, RingBlockObject *block)
{
    if (self->blocks_count == self->blocks_capacity) {
        Py_ssize_t capacity = self->blocks_capacity ? 2 * self->blocks_capacity : 16;
        RingBlockObject **blocks = PyMem_Malloc(capacity * sizeof(*blocks));
        if (blocks == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < self->blocks_count; i++)
            blocks[i] = self->blocks[(self->blocks_start + i) % self->blocks_capacity];
        PyMem_Free(self->blocks);
        self->blocks = blocks;
        self->blocks_start = 0;
        self->blocks_capacity = capacity;
    }
    self->blocks[(self->blocks_start + self->blocks_count) % self->blocks_capacity] = block;
    self->blocks_count++;
    return 0;
}

static void ring_pop_front(RingObject *self)
{
    RingBlockObject *block = ring_front(self);
    self->blocks_start = (self->blocks_start + 1) % self->blocks_capacity;
    self->blocks_count--;
    Py_DECREF(block);
}

/* The object fields of a RingObject, for traverse and clear. */
#define RING_OBJECT_FIELDS(X) \
    X(self->backing); X(self->lock); X(self->lock_acquire); X(self->lock_release); \
    X(self->lock_is_owned); X(self->allocator); X(self->heap_name); X(self->heap); X(self->total); \
    X(self->device_memory); X(self->parked); X(self->closed);

CORE_TRAVERSE_AND_CLEAR(ring, RingObject, RING_OBJECT_FIELDS)

static int ring_clear_all(RingObject *self)
{
    ring_clear(self);
    while (self->blocks_count)
        ring_pop_front(self);
    PyMem_Free(self->blocks);
    self->blocks = NULL;
    self->blocks_capacity = self->blocks_start = 0;
    return 0;
}

CORE_DEALLOC(ring, RingObject, ring_clear_all)

static PyObject *ring_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    return type->tp_alloc(type, 0);
}

static int ring_lock(RingObject *self)
{
    if (self->lock_acquire == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "transient ring used before it has a lock");
        return -1;
    }
    PyObject *got = PyObject_CallNoArgs(self->lock_acquire);
    if (got == NULL)
        return -1;
    Py_DECREF(got);
    return 0;
}

/* Releases the lock, keeping any current exception; -1 if releasing failed. */
static int ring_unlock(RingObject *self)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *done = PyObject_CallNoArgs(self->lock_release);
    if (done == NULL) {
        if (type != NULL) {
            PyErr_Clear();
            PyErr_Restore(type, value, traceback);
        }
        return -1;
    }
    Py_DECREF(done);
    PyErr_Restore(type, value, traceback);
    return type == NULL ? 0 : -1;
}

static int counter_add(HeapCounterObject *counter, long long delta)
{
    if (counter != NULL) {
        counter->live += delta;
        if (counter->live > counter->peak)
            counter->peak = counter->live;
    }
    return 0;
}

/* The allocator's profile hears of a change of the transient heap (lock held). */
static int ring_record_heap_change(RingObject *self, long long delta)
{
    if (!present(self->allocator) || self->total == NULL)
        return 0;
    PyObject *profile = PyObject_GetAttr(self->allocator, str_profile);
    if (profile == NULL)
        return -1;
    int status = 0;
    if (profile != Py_None) {
        PyObject *done = PyObject_CallMethod(profile, "record_heap_change", "OLLL",
                                             self->heap_name, delta, self->total->live,
                                             self->total->peak);
        status = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    Py_DECREF(profile);
    return status;
}

/* Where a new run of `need` bytes could start (lock held): the lowest gap between the runs
 * that holds it, or -1. */
static long long ring_lowest_gap(RingObject *self, long long need)
{
    RingRun sorted[RING_RUNS];
    int n = self->runs_count;
    for (int i = 0; i < n; i++) { /* insertion sort by start: at most RING_RUNS runs */
        int j = i;
        while (j > 0 && sorted[j - 1].start > self->runs[i].start) {
            sorted[j] = sorted[j - 1];
            j--;
        }
        sorted[j] = self->runs[i];
    }
    long long from = 0;
    for (int i = 0; i < n; i++) {
        if (sorted[i].start - from >= need)
            return from;
        from = sorted[i].end;
    }
    return self->capacity - from >= need ? from : -1;
}

/* Room for `size` bytes (lock held): a new block, NULL with no exception when it does not
 * fit (now), NULL with one on error.
 *
 * The head wraps to 0 as soon as the room below every run holds both the request and the
 * live span (the runs' extents), not only when it reaches the end: under steady traffic
 * some block is always live, and a head that wrapped only at the end would walk (and make
 * resident) every page of the capacity. So the ring stays within about twice its largest
 * live span. When the newest run runs into an older one (a block outliving its lap), the
 * block starts a run in the lowest gap that holds it rather than waiting; it waits only
 * when no gap does, or all RING_RUNS runs are in use. */
static RingBlockObject *ring_place(RingObject *self, long long size)
{
    if (size < 0 || size > self->capacity) /* never fits: the caller's check names it */
        return NULL;
    long long need = ((size + RING_ALIGNMENT - 1) & ~(long long)(RING_ALIGNMENT - 1));
    if (need == 0)
        need = RING_ALIGNMENT; /* never empty */
    long long offset;
    int new_run = 1;
    if (self->blocks_count == 0) {
        if (need > self->capacity)
            return NULL;
        offset = 0;
        if (!present(self->backing)) {
            PyObject *made = PyObject_CallMethodNoArgs((PyObject *)self, str_ensure_backing);
            if (made == NULL)
                return NULL;
            Py_DECREF(made);
        }
    } else {
        RingRun *newest = &self->runs[self->runs_count - 1];
        long long lowest = newest->start, span = 0, limit = self->capacity;
        for (int i = 0; i < self->runs_count; i++) {
            RingRun *run = &self->runs[i];
            span += run->end - run->start;
            if (run->start < lowest)
                lowest = run->start;
            if (run != newest && run->start >= newest->end && run->start < limit)
                limit = run->start;
        }
        if (lowest > 0 && need <= lowest && span <= lowest && self->runs_count < RING_RUNS)
            offset = 0; /* wrap early: the room below every run holds the live span */
        else if (newest->end + need <= limit) {
            offset = newest->end;
            new_run = 0;
        } else if (self->runs_count < RING_RUNS)
            offset = ring_lowest_gap(self, need);
        else
            offset = -1;
        if (offset < 0)
            return NULL;
    }
    RingBlockObject *block = PyObject_New(RingBlockObject, &RingBlockType);
    if (block == NULL)
        return NULL;
    block->offset = offset;
    block->size = need;
    block->requested = size;
    block->retired = 0;
    block->starts_run = (char)new_run;
    if (ring_push(self, block) < 0) {
        Py_DECREF(block);
        return NULL;
    }
    if (new_run)
        self->runs[self->runs_count++] = (RingRun){offset, offset + need};
    else
        self->runs[self->runs_count - 1].end = offset + need;
    Py_INCREF(block); /* one for the ring, one for the caller */
    self->head = offset + need;
    if (self->head > self->high_water)
        self->high_water = self->head;
    self->live += need;
    self->reservations++;
    if (self->live > self->peak)
        self->peak = self->live;
    if (self->heap != NULL) {
        counter_add(self->heap, need);
        self->heap->allocated += need;
        self->heap->count++;
        counter_add(self->total, need);
        counter_add(self->device_memory, need);
        if (ring_record_heap_change(self, need) < 0) {
            Py_DECREF(block);
            return NULL;
        }
    }
    return block;
}

/* Retires `block` (lock held): 1 if parked requests may now fit (the caller grants them
 * through `_grant_parked`), 0 if not, -1 on error. */
static int ring_free_locked(RingObject *self, RingBlockObject *block)
{
    if (block->retired)
        return 0;
    block->retired = 1;
    long long size = block->size;
    self->live -= size;
    int status = 0;
    if (self->heap != NULL) { /* before any grant */
        self->heap->live -= size;
        self->heap->freed += size;
        if (self->total != NULL)
            self->total->live -= size;
        if (self->device_memory != NULL)
            self->device_memory->live -= size;
        status = ring_record_heap_change(self, -size);
    }
    while (self->blocks_count && ring_front(self)->retired) {
        ring_pop_front(self);
        if (self->blocks_count && ring_front(self)->starts_run) { /* the oldest run is gone */
            self->runs_count--;
            memmove(self->runs, self->runs + 1, self->runs_count * sizeof(RingRun));
        }
    }
    if (self->blocks_count) {
        self->tail = self->runs[0].start = ring_front(self)->offset;
    } else {
        self->head = self->tail = 0;
        self->runs_count = 0;
    }
    if (status < 0)
        return -1;
    Py_ssize_t parked = present(self->parked) ? PyObject_Length(self->parked) : 0;
    if (parked < 0)
        return -1;
    return parked > 0;
}

/* The grants to make after freeing (lock held): `_grant_parked()`'s list. */
static PyObject *ring_grants(RingObject *self, int parked)
{
    if (parked < 0)
        return NULL;
    if (!parked) {
        Py_INCREF(empty_tuple);
        return empty_tuple;
    }
    return PyObject_CallMethodNoArgs((PyObject *)self, str_grant_parked);
}

static int ring_run_grants(PyObject *grants)
{
    Py_ssize_t n = PySequence_Length(grants);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *grant = PySequence_GetItem(grants, i);
        if (grant == NULL)
            return -1;
        PyObject *done = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(grant, 0),
                                                      PyTuple_GET_ITEM(grant, 1), Py_None, NULL);
        Py_DECREF(grant);
        if (done == NULL)
            return -1;
        Py_DECREF(done);
    }
    return n < 0 ? -1 : 0;
}

static long long as_size(PyObject *value)
{
    long long size = PyLong_AsLongLong(value);
    if (size == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -2;
        PyErr_Clear();
        return LLONG_MAX; /* never fits */
    }
    return size;
}

static PyObject *ring_py_place(RingObject *self, PyObject *size_obj)
{
    long long size = as_size(size_obj);
    if (size == -2)
        return NULL;
    RingBlockObject *block = ring_place(self, size);
    if (block == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return (PyObject *)block;
}

static PyObject *ring_py_free_locked(RingObject *self, PyObject *block)
{
    if (!PyObject_TypeCheck(block, &RingBlockType)) {
        PyErr_Format(PyExc_TypeError, "not a RingBlock: %R", block);
        return NULL;
    }
    return ring_grants(self, ring_free_locked(self, (RingBlockObject *)block));
}

static PyObject *ring_py_free(RingObject *self, PyObject *block)
{
    if (!PyObject_TypeCheck(block, &RingBlockType)) {
        PyErr_Format(PyExc_TypeError, "not a RingBlock: %R", block);
        return NULL;
    }
    if (ring_lock(self) < 0)
        return NULL;
    PyObject *grants = ring_grants(self, ring_free_locked(self, (RingBlockObject *)block));
    if (ring_unlock(self) < 0)
        Py_CLEAR(grants);
    return grants;
}

/* Points `storage` at `block` (lock held). */
static int ring_commit_locked(RingObject *self, PyObject *storage, RingBlockObject *block,
                              long long length)
{
    PyObject *array = PySequence_GetSlice(self->backing, (Py_ssize_t)block->offset,
                                          (Py_ssize_t)(block->offset + length));
    if (array == NULL)
        return -1;
    PyObject *address = PyLong_FromLongLong(self->backing_address + block->offset);
    if (address == NULL) {
        Py_DECREF(array);
        return -1;
    }
    int status = 0;
    if (Py_TYPE(storage) == &RingStorageType) {
        RingStorageObject *placed = (RingStorageObject *)storage;
        Py_XSETREF(placed->base.array, Py_NewRef(array));
        Py_XSETREF(placed->base.address, Py_NewRef(address));
        Py_XSETREF(placed->ring, Py_NewRef((PyObject *)self));
        Py_XSETREF(placed->block, Py_NewRef((PyObject *)block));
    } else if (PyObject_SetAttr(storage, str_array, array) < 0
               || PyObject_SetAttr(storage, str_address, address) < 0
               || PyObject_SetAttr(storage, str_ring, (PyObject *)self) < 0
               || PyObject_SetAttr(storage, str_block, (PyObject *)block) < 0) {
        status = -1;
    }
    Py_DECREF(array);
    Py_DECREF(address);
    return status;
}

/* Places `length` bytes and commits them to `storage` under the lock, if the ring has
 * room and no request is parked ahead and it is open: 1 if so, 0 if not, -1 on error. */
static int ring_commit_if_room(RingObject *self, PyObject *storage, long long length)
{
    if (ring_lock(self) < 0)
        return -1;
    int committed = 0;
    Py_ssize_t parked = present(self->parked) ? PyObject_Length(self->parked) : 0;
    if (parked == 0 && !present(self->closed)) {
        RingBlockObject *block = ring_place(self, length);
        if (block != NULL) {
            committed = ring_commit_locked(self, storage, block, length) < 0 ? -1 : 1;
            Py_DECREF(block);
        } else if (PyErr_Occurred()) {
            committed = -1;
        }
    } else if (parked < 0) {
        committed = -1;
    }
    return ring_unlock(self) < 0 ? -1 : committed;
}

static PyObject *ring_try_commit(RingObject *self, PyObject *storage)
{
    PyObject *length_obj = PyObject_GetAttr(storage, str_byte_length);
    if (length_obj == NULL)
        return NULL;
    long long length = as_size(length_obj);
    Py_DECREF(length_obj);
    if (length == -2)
        return NULL;
    int committed = ring_commit_if_room(self, storage, length);
    return committed < 0 ? NULL : PyBool_FromLong(committed);
}

/* A transient buffer of `size` bytes over a new RingStorage committed to a block placed
 * now (a pending buffer and `try_commit` in one call), or None when the ring has no room
 * now, a request is parked ahead, or the ring is closed (the caller queues the alloca).
 * The objects come from their one constructor each (`ring_storage_make`,
 * `buffer_make`). */
static PyObject *ring_commit_new(RingObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "commit_new(allocator, size, memory_type_bits, usage_bits)");
        return NULL;
    }
    if (buffer_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "tinyhal _core used before hal.buffer registered Buffer");
        return NULL;
    }
    PyObject *size = args[1];
    if (!PyLong_CheckExact(size))
        Py_RETURN_NONE;
    long long length = as_size(size);
    if (length == -2)
        return NULL;
    if (length < 0)
        Py_RETURN_NONE;
    PyObject *storage = ring_storage_make(size);
    if (storage == NULL)
        return NULL;
    int committed = ring_commit_if_room(self, storage, length);
    if (committed <= 0) {
        Py_DECREF(storage); /* a committed block goes back through its collection */
        if (committed == 0 && !PyErr_Occurred())
            Py_RETURN_NONE;
        return NULL;
    }
    PyObject *buffer = buffer_make(buffer_class, args[0], storage, zero, size, args[2],
                                   args[3], memory_access_all);
    Py_DECREF(storage);
    return buffer;
}

static PyObject *ring_release(RingObject *self, PyObject *storage)
{
    if (Py_TYPE(storage) != &RingStorageType
        || ((RingStorageObject *)storage)->ring != (PyObject *)self)
        Py_RETURN_NONE;
    if (ring_lock(self) < 0)
        return NULL;
    PyObject *grants = NULL;
    RingStorageObject *placed = (RingStorageObject *)storage;
    PyObject *block = placed->block;
    if (block == NULL || block == Py_None) {
        Py_INCREF(empty_tuple);
        grants = empty_tuple;
    } else if (!PyObject_TypeCheck(block, &RingBlockType)) {
        PyErr_Format(PyExc_TypeError, "not a RingBlock: %R", block);
    } else {
        Py_INCREF(block);
        Py_XSETREF(placed->block, Py_NewRef(Py_None));
        grants = ring_grants(self, ring_free_locked(self, (RingBlockObject *)block));
        Py_DECREF(block);
    }
    if (ring_unlock(self) < 0)
        Py_CLEAR(grants);
    if (grants == NULL)
        return NULL;
    int status = ring_run_grants(grants);
    Py_DECREF(grants);
    if (status < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *str_retire_later, *str_grant_later;

/* A storage died still holding `block` (see TransientRingbuffer.collected): retired here
 * unless this thread holds the ring's lock (a collection inside a locked section), when
 * the whole retirement goes to the reclaim thread; grants always do. */
static PyObject *ring_collected(RingObject *self, PyObject *block)
{
    if (!PyObject_TypeCheck(block, &RingBlockType)) {
        PyErr_Format(PyExc_TypeError, "not a RingBlock: %R", block);
        return NULL;
    }
    if (self->lock_is_owned == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "transient ring used before it has a lock");
        return NULL;
    }
    PyObject *owned = PyObject_CallNoArgs(self->lock_is_owned);
    if (owned == NULL)
        return NULL;
    int mine = PyObject_IsTrue(owned);
    Py_DECREF(owned);
    if (mine < 0)
        return NULL;
    if (mine)
        return PyObject_CallMethodOneArg((PyObject *)self, str_retire_later, block);
    if (ring_lock(self) < 0)
        return NULL;
    PyObject *grants = ring_grants(self, ring_free_locked(self, (RingBlockObject *)block));
    if (ring_unlock(self) < 0)
        Py_CLEAR(grants);
    if (grants == NULL)
        return NULL;
    Py_ssize_t n = PyObject_Length(grants);
    PyObject *done = n > 0 ? PyObject_CallMethodOneArg((PyObject *)self, str_grant_later, grants)
                           : (n < 0 ? NULL : Py_NewRef(Py_None));
    Py_DECREF(grants);
    return done;
}

/* Whether `storage` holds a block of this ring (committed and not released). */
static PyObject *ring_owns(RingObject *self, PyObject *storage)
{
    if (Py_TYPE(storage) != &RingStorageType)
        Py_RETURN_FALSE;
    RingStorageObject *placed = (RingStorageObject *)storage;
    return PyBool_FromLong(placed->ring == (PyObject *)self && placed->block != NULL
                           && placed->block != Py_None);
}

static PyObject *ring_live_blocks(RingObject *self, PyObject *unused)
{
    Py_ssize_t live = 0;
    for (Py_ssize_t i = 0; i < self->blocks_count; i++)
        live += !self->blocks[(self->blocks_start + i) % self->blocks_capacity]->retired;
    return PyLong_FromSsize_t(live);
}

/* The end of the highest unreclaimed block (lock held), 0 when there is none: nothing of
 * the ring above it is in use, so its pages may be given back. */
static PyObject *ring_live_end(RingObject *self, PyObject *unused)
{
    long long end = 0;
    for (int i = 0; i < self->runs_count; i++)
        if (self->runs[i].end > end)
            end = self->runs[i].end;
    return PyLong_FromLongLong(end);
}

static PyObject *ring_get_lock(RingObject *self, void *closure)
{
    if (self->lock == NULL)
        Py_RETURN_NONE;
    Py_INCREF(self->lock);
    return self->lock;
}

static int ring_set_lock(RingObject *self, PyObject *lock, void *closure)
{
    if (lock == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a ring's lock cannot be deleted");
        return -1;
    }
    PyObject *acquire = PyObject_GetAttrString(lock, "acquire");
    PyObject *release = PyObject_GetAttrString(lock, "release");
    PyObject *is_owned = PyObject_GetAttrString(lock, "_is_owned"); /* an RLock's */
    if (acquire == NULL || release == NULL || is_owned == NULL) {
        Py_XDECREF(acquire);
        Py_XDECREF(release);
        Py_XDECREF(is_owned);
        return -1;
    }
    Py_INCREF(lock);
    Py_XSETREF(self->lock, lock);
    Py_XSETREF(self->lock_acquire, acquire);
    Py_XSETREF(self->lock_release, release);
    Py_XSETREF(self->lock_is_owned, is_owned);
    return 0;
}

/* The counters: a HeapCounter or None (not counted). */
static PyObject *ring_get_counter(RingObject *self, void *offset)
{
    PyObject *counter = *(PyObject **)((char *)self + (size_t)offset);
    if (counter == NULL)
        Py_RETURN_NONE;
    Py_INCREF(counter);
    return counter;
}

static int ring_set_counter(RingObject *self, PyObject *value, void *offset)
{
    if (value != NULL && value != Py_None && Py_TYPE(value) != &HeapCounterType) {
        PyErr_Format(PyExc_TypeError, "a ring counts into a HeapCounter, not %R", value);
        return -1;
    }
    PyObject **slot = (PyObject **)((char *)self + (size_t)offset);
    PyObject *counter = value == Py_None ? NULL : value;
    Py_XINCREF(counter);
    Py_XSETREF(*slot, counter);
    return 0;
}

static PyMethodDef ring_methods[] = {
    {"_place", (PyCFunction)ring_py_place, METH_O,
     "_place(size) -> RingBlock | None: room for size bytes at the head (lock held)."},
    {"_free_locked", (PyCFunction)ring_py_free_locked, METH_O,
     "_free_locked(block) -> grants to make: retires block (lock held)."},
    {"_free", (PyCFunction)ring_py_free, METH_O,
     "_free(block) -> grants to make: retires block under the lock."},
    {"commit_new", (PyCFunction)(void (*)(void))ring_commit_new, METH_FASTCALL,
     "commit_new(allocator, size, memory_type_bits, usage_bits) -> Buffer | None (core.c)."},
    {"try_commit", (PyCFunction)ring_try_commit, METH_O,
     "See hal.ringbuffer.TransientRingbuffer.try_commit."},
    {"release", (PyCFunction)ring_release, METH_O,
     "See hal.ringbuffer.TransientRingbuffer.release."},
    {"collected", (PyCFunction)ring_collected, METH_O,
     "See hal.ringbuffer.TransientRingbuffer.collected."},
    {"owns", (PyCFunction)ring_owns, METH_O,
     "owns(storage) -> whether storage holds a block of this ring (committed, not released)."},
    {"_live_blocks", (PyCFunction)ring_live_blocks, METH_NOARGS,
     "How many blocks are live (lock held)."},
    {"_live_end", (PyCFunction)ring_live_end, METH_NOARGS,
     "The end of the highest unreclaimed block, 0 if none (lock held)."},
    {NULL},
};

static PyMemberDef ring_members[] = {
    {"capacity", T_LONGLONG, offsetof(RingObject, capacity), 0, NULL},
    {"_head", T_LONGLONG, offsetof(RingObject, head), READONLY, NULL},
    {"_tail", T_LONGLONG, offsetof(RingObject, tail), READONLY, NULL},
    {"_live", T_LONGLONG, offsetof(RingObject, live), READONLY, NULL},
    {"_peak", T_LONGLONG, offsetof(RingObject, peak), READONLY, NULL},
    {"_high_water", T_LONGLONG, offsetof(RingObject, high_water), READONLY, NULL},
    {"_reservations", T_LONGLONG, offsetof(RingObject, reservations), READONLY, NULL},
    {"_waits", T_LONGLONG, offsetof(RingObject, waits), 0, NULL},
    {"_backing", T_OBJECT, offsetof(RingObject, backing), 0, NULL},
    {"_backing_address", T_LONGLONG, offsetof(RingObject, backing_address), 0, NULL},
    {"allocator", T_OBJECT, offsetof(RingObject, allocator), 0, NULL},
    {"_heap_name", T_OBJECT, offsetof(RingObject, heap_name), 0, NULL},
    {"_parked", T_OBJECT, offsetof(RingObject, parked), 0, NULL},
    {"_closed", T_OBJECT, offsetof(RingObject, closed), 0, NULL},
    {NULL},
};

static PyGetSetDef ring_getset[] = {
    {"_lock", (getter)ring_get_lock, (setter)ring_set_lock, NULL, NULL},
    {"_heap_counter", (getter)ring_get_counter, (setter)ring_set_counter, NULL,
     (void *)offsetof(RingObject, heap)},
    {"_total", (getter)ring_get_counter, (setter)ring_set_counter, NULL,
     (void *)offsetof(RingObject, total)},
    {"_device_memory", (getter)ring_get_counter, (setter)ring_set_counter, NULL,
     (void *)offsetof(RingObject, device_memory)},
    {NULL},
};

static PyTypeObject RingCoreType = {
    CORE_BASE_TYPE("RingCore", RingObject, ring,
                   "The state of a transient ring and its placement, retirement and "
                   "counters (hal.ringbuffer.TransientRingbuffer), changed under the "
                   "allocator's lock."),
    .tp_methods = ring_methods,
    .tp_members = ring_members,
    .tp_getset = ring_getset,
};

/* ---------------------------------------------------------------------------------- */
/* SubmissionCore, and adopting a recording over new direct buffers                   */

/* The fields of a validated submission (hal.execution.Submission): per command buffer
 * its recording and slot entries (`parts`), every slot's address (None while a buffer has
 * no memory) and length, as a native stream binds them, and the profile instrumentation
 * (None, or (profile, submission_id, queue)). */
typedef struct {
    PyObject_HEAD
    PyObject *parts, *addresses, *lengths, *instrument;
    PyObject *weakrefs;
} SubmissionObject;

static PyTypeObject SubmissionCoreType;
static PyTypeObject *submission_class;

#define BINDING_ALIGNMENT 64 /* hal.buffer.ALIGNMENT: what kernels' aligned loads need */

/* The one constructor of a submission: `Submission(...)` (its `__new__`) and `adopt`
 * come here (references stolen). */
static PyObject *submission_make(PyTypeObject *type, PyObject *parts, PyObject *addresses,
                                 PyObject *lengths)
{
    SubmissionObject *self = parts == NULL || addresses == NULL || lengths == NULL
        ? NULL : (SubmissionObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_XDECREF(parts);
        Py_XDECREF(addresses);
        Py_XDECREF(lengths);
        return NULL;
    }
    self->parts = parts;
    self->addresses = addresses;
    self->lengths = lengths;
    self->instrument = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static PyObject *submission_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"parts", "addresses", "lengths", NULL};
    PyObject *parts, *addresses = Py_None, *lengths = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO:Submission", kwlist, &parts,
                                     &addresses, &lengths))
        return NULL;
    return submission_make(type, Py_NewRef(parts), Py_NewRef(addresses),
                           lengths == NULL ? PyList_New(0) : Py_NewRef(lengths));
}

#define SUBMISSION_OBJECT_FIELDS(X) \
    X(self->parts); X(self->addresses); X(self->lengths); X(self->instrument);

CORE_TRAVERSE_AND_CLEAR(submission, SubmissionObject, SUBMISSION_OBJECT_FIELDS)
CORE_DEALLOC(submission, SubmissionObject, submission_clear)

static PyMemberDef submission_members[] = {
    {"parts", T_OBJECT_EX, offsetof(SubmissionObject, parts), 0, NULL},
    {"addresses", T_OBJECT_EX, offsetof(SubmissionObject, addresses), 0, NULL},
    {"lengths", T_OBJECT_EX, offsetof(SubmissionObject, lengths), 0, NULL},
    {"instrument", T_OBJECT_EX, offsetof(SubmissionObject, instrument), 0, NULL},
    {NULL},
};

static PyTypeObject SubmissionCoreType = {
    CORE_BASE_TYPE("SubmissionCore", SubmissionObject, submission,
                   "The fields of a validated submission (hal.execution.Submission): "
                   "parts, addresses, lengths, instrument."),
    .tp_members = submission_members,
};

/* `value` as a long long >= 0 (an int), or -1 (not one: the caller refuses). */
static long long small_int(PyObject *value)
{
    if (!PyLong_Check(value))
        return -1;
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return v;
}

/* Whether `length` bytes of `buffer` from `base` (its slot's range) meet `need`, a
 * Recording's need of one slot `(usage_bits, bytes reached, offset residues)`: live, the
 * usage bits, the bytes, and every bound offset's address 64-byte aligned. 1 if so, 0 if
 * not (or if `need` is not that form). `buffer`'s storage is a StorageCore. */
static int meets_need(BufferObject *buffer, long long base, long long length, PyObject *need)
{
    StorageObject *storage = (StorageObject *)buffer->storage;
    if (!PyTuple_CheckExact(need) || PyTuple_GET_SIZE(need) != 3
        || storage->released != Py_False)
        return 0;
    long long usage = small_int(buffer->usage_bits);
    long long wanted = small_int(PyTuple_GET_ITEM(need, 0));
    long long reach = small_int(PyTuple_GET_ITEM(need, 1));
    long long address = small_int(storage->address);
    long long offset = small_int(buffer->byte_offset);
    PyObject *residues = PyTuple_GET_ITEM(need, 2);
    if (usage < 0 || wanted < 0 || reach < 0 || address < 0 || offset < 0
        || (usage & wanted) != wanted || length < reach || !PyTuple_CheckExact(residues))
        return 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(residues); k++) {
        long long residue = small_int(PyTuple_GET_ITEM(residues, k));
        if (residue < 0
            || (unsigned long long)(address + offset + base + residue) % BINDING_ALIGNMENT)
            return 0;
    }
    return 1;
}

/* Appends slot `(buffer, base, length)` to `entries`, its address to `addresses` and
 * its length to `lengths`; clears `*has_memory` if the buffer has no memory yet. */
static int append_slot(BufferObject *buffer, PyObject *base, PyObject *length,
                       PyObject *entries, PyObject *addresses, PyObject *lengths,
                       int *has_memory)
{
    StorageObject *storage = (StorageObject *)buffer->storage;
    int placed = PyObject_IsTrue(storage->address);
    if (placed < 0)
        return -1;
    if (!placed)
        *has_memory = 0;
    PyObject *entry = PyTuple_Pack(3, (PyObject *)buffer, base, length);
    PyObject *start = PyNumber_Add(storage->address, buffer->byte_offset);
    PyObject *address = start == NULL ? NULL : PyNumber_Add(start, base);
    Py_XDECREF(start);
    int status = entry == NULL || address == NULL || PyList_Append(entries, entry) < 0
                 || PyList_Append(addresses, address) < 0 || PyList_Append(lengths, length) < 0
                 ? -1 : 0;
    Py_XDECREF(entry);
    Py_XDECREF(address);
    return status;
}

/* Whether `item` is a Buffer (any subclass) whose storage C reads. */
static int is_core_buffer(PyObject *item)
{
    return PyObject_TypeCheck(item, &BufferCoreType)
           && PyObject_TypeCheck(((BufferObject *)item)->storage, &StorageCoreType);
}

/* adopt(recording, needs, direct): hal.execution.Recording.adopter's check (see there). */
static PyObject *core_adopt(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyTuple_CheckExact(args[1]) || !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "adopt(recording, needs: tuple, direct: list)");
        return NULL;
    }
    if (buffer_class == NULL || submission_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "tinyhal _core used before Buffer and Submission were registered");
        return NULL;
    }
    PyObject *needs = args[1], *direct = args[2];
    Py_ssize_t count = PyTuple_GET_SIZE(needs);
    if (PyList_GET_SIZE(direct) != count)
        Py_RETURN_NONE;
    /* slot order is `direct` reversed (slot -1, the last, is direct[0]) */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(direct, count - 1 - i);
        if (Py_TYPE(item) != buffer_class || !is_core_buffer(item))
            Py_RETURN_NONE;
        BufferObject *buffer = (BufferObject *)item;
        if (!meets_need(buffer, 0, small_int(buffer->byte_length),
                        PyTuple_GET_ITEM(needs, i)))
            Py_RETURN_NONE;
    }
    /* every buffer passed: the submission's entries, addresses and lengths, slot order */
    PyObject *entries = PyList_New(0);
    PyObject *addresses = PyList_New(0);
    PyObject *lengths = PyList_New(0);
    int has_memory = 1;
    if (entries == NULL || addresses == NULL || lengths == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        BufferObject *buffer = (BufferObject *)PyList_GET_ITEM(direct, count - 1 - i);
        if (append_slot(buffer, zero, buffer->byte_length, entries, addresses, lengths,
                        &has_memory) < 0)
            goto fail;
    }
    PyObject *part = PyTuple_Pack(2, args[0], entries);
    Py_DECREF(entries);
    entries = NULL;
    PyObject *parts = part == NULL ? NULL : PyList_New(1);
    if (parts == NULL) {
        Py_XDECREF(part);
        goto fail;
    }
    PyList_SET_ITEM(parts, 0, part);
    if (!has_memory)
        Py_SETREF(addresses, Py_NewRef(Py_None));
    return submission_make(submission_class, parts, addresses, lengths);
fail:
    Py_XDECREF(entries);
    Py_XDECREF(addresses);
    Py_XDECREF(lengths);
    return NULL;
}

/* bind_slots(needs, table, direct, addresses, lengths, normalize) -> (entries,
 * has_memory, ok): hal.execution.Recording.bind's pass over the slots (see there). */
static PyObject *core_bind_slots(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyTuple_CheckExact(args[0]) || !PyList_CheckExact(args[2])
        || !PyList_CheckExact(args[3]) || !PyList_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "bind_slots(needs: tuple, table, direct: list, "
                                         "addresses: list, lengths: list, normalize)");
        return NULL;
    }
    if (buffer_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "tinyhal _core used before Buffer was registered");
        return NULL;
    }
    PyObject *needs = args[0], *table = args[1], *direct = args[2];
    PyObject *addresses = args[3], *lengths = args[4], *normalize = args[5];
    Py_ssize_t n = PyTuple_GET_SIZE(needs);
    PyObject *entries = PyList_New(0);
    if (entries == NULL)
        return NULL;
    int ok = 1, has_memory = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entry = PySequence_GetItem(table, i);
        if (entry == NULL)
            goto fail;
        PyObject *range = NULL; /* (buffer, base, length), a new reference */
        if (PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 3) {
            PyObject *buffer = PyTuple_GET_ITEM(entry, 0);
            long long base = PyLong_CheckExact(PyTuple_GET_ITEM(entry, 1))
                             ? small_int(PyTuple_GET_ITEM(entry, 1)) : -1;
            long long length = PyLong_CheckExact(PyTuple_GET_ITEM(entry, 2))
                               ? small_int(PyTuple_GET_ITEM(entry, 2)) : -1;
            long long size = Py_TYPE(buffer) == buffer_class
                             ? small_int(((BufferObject *)buffer)->byte_length) : -1;
            if (base >= 0 && length >= 0 && size >= 0 && base <= size && length <= size - base)
                range = Py_NewRef(entry);
        } else if (Py_TYPE(entry) == buffer_class) {
            range = PyTuple_Pack(3, entry, zero, ((BufferObject *)entry)->byte_length);
            if (range == NULL) {
                Py_DECREF(entry);
                goto fail;
            }
        }
        if (range == NULL) {
            PyObject *index = PyLong_FromSsize_t(i);
            PyObject *call_args[] = {entry, index};
            range = index == NULL ? NULL : PyObject_Vectorcall(normalize, call_args, 2, NULL);
            Py_XDECREF(index);
        }
        Py_DECREF(entry);
        if (range == NULL)
            goto fail;
        PyObject *items = PySequence_Tuple(range);
        Py_DECREF(range);
        if (items == NULL)
            goto fail;
        PyObject *buffer = PyTuple_GET_SIZE(items) == 3 ? PyTuple_GET_ITEM(items, 0) : NULL;
        if (buffer == NULL || !is_core_buffer(buffer)) {
            Py_DECREF(items);
            PyErr_SetString(PyExc_TypeError, "a binding table entry normalized to no buffer");
            goto fail;
        }
        PyObject *base = PyTuple_GET_ITEM(items, 1), *length = PyTuple_GET_ITEM(items, 2);
        if (!meets_need((BufferObject *)buffer, small_int(base), small_int(length),
                        PyTuple_GET_ITEM(needs, i)))
            ok = 0;
        int status = append_slot((BufferObject *)buffer, base, length, entries, addresses,
                                 lengths, &has_memory);
        Py_DECREF(items);
        if (status < 0)
            goto fail;
    }
    for (Py_ssize_t i = PyList_GET_SIZE(direct) - 1; i >= 0; i--) { /* slot -1 is the last */
        PyObject *item = PyList_GET_ITEM(direct, i);
        if (!is_core_buffer(item)) {
            PyErr_Format(PyExc_TypeError, "not a buffer among the direct buffers: %R", item);
            goto fail;
        }
        BufferObject *buffer = (BufferObject *)item;
        if (((StorageObject *)buffer->storage)->released != Py_False)
            ok = 0;
        if (append_slot(buffer, zero, buffer->byte_length, entries, addresses, lengths,
                        &has_memory) < 0)
            goto fail;
    }
    return Py_BuildValue("(NOO)", entries, has_memory ? Py_True : Py_False,
                         ok ? Py_True : Py_False);
fail:
    Py_DECREF(entries);
    return NULL;
}

/* ---------------------------------------------------------------------------------- */
/* Module functions                                                                   */

/* 0 if hal.semaphore has registered its classes, else -1 with an error. */
static int check_registered(void)
{
    if (semaphore_class == NULL || fence_class == NULL || normalize_general == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "tinyhal _core used before hal.semaphore registered Semaphore and Fence");
        return -1;
    }
    return 0;
}

/* A fence of one new semaphore at `value`, reached at 1. */
static PyObject *one_point_fence(unsigned long long value)
{
    if (check_registered() < 0)
        return NULL;
    PyObject *sem = semaphore_make(semaphore_class, value, empty_str);
    if (sem == NULL)
        return NULL;
    PyObject *point = PyTuple_Pack(2, sem, one);
    Py_DECREF(sem);
    if (point == NULL)
        return NULL;
    PyObject *points = PyTuple_Pack(1, point);
    Py_DECREF(point);
    if (points == NULL)
        return NULL;
    return fence_make(fence_class, points, NULL);
}

static PyObject *core_pending_fence(PyObject *module, PyObject *unused)
{
    return one_point_fence(0);
}

static PyObject *core_reached_fence(PyObject *module, PyObject *unused)
{
    return one_point_fence(1);
}

/* Merges the points of `fence` into `timeline` (largest value per semaphore). */
static int merge_points(PyObject *timeline, PyObject *fence)
{
    PyObject *points = ((FenceObject *)fence)->points;
    Py_ssize_t n = PyTuple_GET_SIZE(points);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *point = PyTuple_GET_ITEM(points, i);
        if (timeline_keep_largest(timeline, PyTuple_GET_ITEM(point, 0),
                                  PyTuple_GET_ITEM(point, 1)) < 0)
            return -1;
    }
    return 0;
}

static PyObject *core_join_fences(PyObject *module, PyObject *fences)
{
    if (check_registered() < 0)
        return NULL;
    PyObject *iterator = PyObject_GetIter(fences);
    if (iterator == NULL)
        return NULL;
    PyObject *timeline = PyDict_New(), *item;
    if (timeline == NULL) {
        Py_DECREF(iterator);
        return NULL;
    }
    while ((item = PyIter_Next(iterator)) != NULL) {
        int failed = 0;
        if (item != Py_None) {
            if (!PyObject_TypeCheck(item, &FenceCoreType)) {
                PyErr_Format(PyExc_TypeError, "Fence.join takes Fences or None, not %R", item);
                failed = 1;
            } else {
                failed = merge_points(timeline, item) < 0;
            }
        }
        Py_DECREF(item);
        if (failed)
            break;
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred()) {
        Py_DECREF(timeline);
        return NULL;
    }
    return fence_of_timeline(fence_class, timeline);
}

/* `hal.fence.join` on the VM's rows (a list of 1-tuples, each a fence or None): the one
 * fence with points among them as it is (a fence never changes), a new joined fence, or
 * None when no row has a point (IREE's null fence). NotImplemented if a row is neither a
 * fence nor None (the caller raises its own error). */
static PyObject *core_join_fence_rows(PyObject *module, PyObject *rows)
{
    if (check_registered() < 0)
        return NULL;
    if (!PyList_CheckExact(rows) && !PyTuple_CheckExact(rows))
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(rows);
    PyObject **items = PySequence_Fast_ITEMS(rows);
    PyObject *only = NULL;
    Py_ssize_t with_points = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = items[i];
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 1)
            Py_RETURN_NOTIMPLEMENTED;
        PyObject *fence = PyTuple_GET_ITEM(row, 0);
        if (fence == Py_None)
            continue;
        if (!PyObject_TypeCheck(fence, &FenceCoreType))
            Py_RETURN_NOTIMPLEMENTED;
        if (PyTuple_GET_SIZE(((FenceObject *)fence)->points)) {
            with_points++;
            only = fence;
        }
    }
    if (with_points == 0)
        Py_RETURN_NONE;
    if (with_points == 1) {
        Py_INCREF(only);
        return only;
    }
    PyObject *timeline = PyDict_New();
    if (timeline == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *fence = PyTuple_GET_ITEM(items[i], 0);
        if (fence != Py_None && merge_points(timeline, fence) < 0) {
            Py_DECREF(timeline);
            return NULL;
        }
    }
    return fence_of_timeline(fence_class, timeline);
}

/* 1 if every point of the tuple `points` is reached and no semaphore failed, 0 if not,
 * -1 if a point is not a (SemaphoreCore, int) pair (the caller takes the general path). */
static int points_reached(PyObject *points)
{
    Py_ssize_t n = PyTuple_GET_SIZE(points);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *point = PyTuple_GET_ITEM(points, i);
        if (!PyTuple_CheckExact(point) || PyTuple_GET_SIZE(point) != 2)
            return -1;
        PyObject *sem = PyTuple_GET_ITEM(point, 0), *value = PyTuple_GET_ITEM(point, 1);
        if (!PyObject_TypeCheck(sem, &SemaphoreCoreType) || !PyLong_CheckExact(value))
            return -1;
        unsigned long long v = PyLong_AsUnsignedLongLong(value);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        SemaphoreObject *s = (SemaphoreObject *)sem;
        if (s->failure != NULL || s->value < v)
            return 0;
    }
    return 1;
}

/* Whether a buffer of `buffers` (a list) has released storage: False when every item is
 * a Buffer whose storage's `released` is False, True otherwise (anything else counts, so
 * that the caller takes the path that names it). */
static PyObject *core_any_released(PyObject *module, PyObject *buffers)
{
    if (!PyList_CheckExact(buffers))
        Py_RETURN_TRUE;
    Py_ssize_t n = PyList_GET_SIZE(buffers);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *buffer = PyList_GET_ITEM(buffers, i);
        if (!PyObject_TypeCheck(buffer, &BufferCoreType))
            Py_RETURN_TRUE;
        PyObject *storage = ((BufferObject *)buffer)->storage;
        if (storage == NULL || !PyObject_TypeCheck(storage, &StorageCoreType)
            || ((StorageObject *)storage)->released != Py_False)
            Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

/* Whether every fence of `fences` (a list or tuple of Fences and Nones) is reached with
 * no semaphore failed: True or False; NotImplemented if an item is neither. */
static PyObject *core_fences_reached(PyObject *module, PyObject *fences)
{
    if (check_registered() < 0)
        return NULL;
    if (!PyList_CheckExact(fences) && !PyTuple_CheckExact(fences))
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fences);
    PyObject **items = PySequence_Fast_ITEMS(fences);
    int all = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *fence = items[i];
        if (fence == Py_None)
            continue;
        if (!PyObject_TypeCheck(fence, &FenceCoreType))
            Py_RETURN_NOTIMPLEMENTED;
        if (all && points_reached(((FenceObject *)fence)->points) != 1)
            all = 0;
    }
    return PyBool_FromLong(all);
}

static PyObject *core_normalize_wait_signal(PyObject *module, PyObject *const *args,
                                            Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "normalize_wait_signal(wait, signal)");
        return NULL;
    }
    PyObject *wait = args[0], *signal = args[1];
    if (check_registered() < 0)
        return NULL;
    if (Py_TYPE(signal) == fence_class || signal == Py_None) {
        PyObject *signal_points = signal == Py_None ? empty_tuple
                                                    : ((FenceObject *)signal)->points;
        if (wait == Py_None)
            return PyTuple_Pack(3, empty_tuple, signal_points, Py_True);
        if (Py_TYPE(wait) == fence_class) {
            PyObject *wait_points = ((FenceObject *)wait)->points;
            int reached = points_reached(wait_points);
            if (reached >= 0)
                return PyTuple_Pack(3, wait_points, signal_points,
                                    reached ? Py_True : Py_False);
        }
    }
    return PyObject_Vectorcall(normalize_general, args, 2, NULL);
}

/* Advances the leading points of `points` (a tuple or list of (Semaphore, value)) that
 * take the fast path; returns how many. It stops at the first point that needs the locked
 * path (a waiter, an error), which the caller then takes, in order, from there. */
static Py_ssize_t advance_prefix(PyObject *points)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(points), i = 0;
    PyObject **items = PySequence_Fast_ITEMS(points);
    for (; i < n; i++) {
        PyObject *point = items[i];
        if (!PyTuple_CheckExact(point) || PyTuple_GET_SIZE(point) != 2)
            break;
        PyObject *sem = PyTuple_GET_ITEM(point, 0);
        if (!PyObject_TypeCheck(sem, &SemaphoreCoreType)
            || !semaphore_advance_fast((SemaphoreObject *)sem, PyTuple_GET_ITEM(point, 1)))
            break;
    }
    return i;
}

/* The completion trampoline of this thread (hal.queue): the deque of completions queued
 * while an outer `complete` runs timepoint callbacks, or NULL. An owned reference. */
static Py_tss_t trampoline_key = Py_tss_NEEDS_INIT;

static PyObject *core_trampoline(PyObject *module, PyObject *unused)
{
    PyObject *pending = PyThread_tss_get(&trampoline_key);
    if (pending == NULL)
        Py_RETURN_NONE;
    Py_INCREF(pending);
    return pending;
}

static PyObject *core_set_trampoline(PyObject *module, PyObject *pending)
{
    PyObject *old = PyThread_tss_get(&trampoline_key);
    PyObject *new = pending == Py_None ? NULL : pending;
    Py_XINCREF(new);
    if (PyThread_tss_set(&trampoline_key, new) != 0) {
        Py_XDECREF(new);
        PyErr_SetString(PyExc_RuntimeError, "cannot set the completion trampoline");
        return NULL;
    }
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

/* `WorkQueue.complete(signal, error)`: with no error and no trampoline running on this
 * thread, the leading points nobody waits on advance here; the rest (a waiter, an error,
 * a failure to spread, a completion to queue) goes to the Python path. */
static PyObject *core_complete(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "complete(signal, error)");
        return NULL;
    }
    if (complete_slow == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "tinyhal _core used before hal.queue registered complete_slow");
        return NULL;
    }
    PyObject *signal = args[0], *error = args[1];
    if (error != Py_None || PyThread_tss_get(&trampoline_key) != NULL
        || (!PyTuple_CheckExact(signal) && !PyList_CheckExact(signal)))
        return PyObject_Vectorcall(complete_slow, args, 2, NULL);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(signal), i = advance_prefix(signal);
    if (i == n)
        Py_RETURN_NONE;
    PyObject *rest = PySequence_GetSlice(signal, i, n);
    if (rest == NULL)
        return NULL;
    PyObject *slow_args[] = {rest, error};
    PyObject *done = PyObject_Vectorcall(complete_slow, slow_args, 2, NULL);
    Py_DECREF(rest);
    return done;
}

/* Sets `*target` to `value` if given, checking it is a subclass of `base` when `base` is
 * not NULL. */
static int register_one(PyObject *kwargs, const char *name, PyObject **target,
                        PyTypeObject *base)
{
    PyObject *value = PyDict_GetItemString(kwargs, name);
    if (value == NULL)
        return 0;
    if (base != NULL
        && (!PyType_Check(value) || !PyType_IsSubtype((PyTypeObject *)value, base))) {
        PyErr_Format(PyExc_TypeError, "register(%s=...) takes a subclass of %s, not %R", name,
                     base->tp_name, value);
        return -1;
    }
    Py_XSETREF(*target, Py_NewRef(value));
    return 1;
}

/* The module's one registration point (see `semaphore_class`). */
static PyObject *core_register(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static const char *const names[] = {"semaphore", "fence", "buffer", "submission",
                                        "normalize_general", "complete_slow"};
    if (PyTuple_GET_SIZE(args) || kwargs == NULL) {
        PyErr_SetString(PyExc_TypeError, "register takes keyword arguments only");
        return NULL;
    }
    PyObject **targets[] = {(PyObject **)&semaphore_class, (PyObject **)&fence_class,
                            (PyObject **)&buffer_class, (PyObject **)&submission_class,
                            &normalize_general, &complete_slow};
    PyTypeObject *bases[] = {&SemaphoreCoreType, &FenceCoreType, &BufferCoreType,
                             &SubmissionCoreType, NULL, NULL};
    Py_ssize_t known = 0;
    for (int i = 0; i < 6; i++) {
        int found = register_one(kwargs, names[i], targets[i], bases[i]);
        if (found < 0)
            return NULL;
        known += found;
    }
    if (known != PyDict_GET_SIZE(kwargs)) {
        PyErr_Format(PyExc_TypeError, "register takes only semaphore, fence, buffer, "
                     "submission, normalize_general and complete_slow, not %R", kwargs);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef core_methods[] = {
    {"register", (PyCFunction)(void (*)(void))core_register, METH_VARARGS | METH_KEYWORDS,
     "register(semaphore=, fence=, buffer=, submission=, normalize_general=, complete_slow=): "
     "the Python classes whose instances this module makes (subclasses of SemaphoreCore, "
     "FenceCore, BufferCore, SubmissionCore) and the Python paths of normalize_wait_signal and complete; each module "
     "registers its own when imported."},
    {"trampoline", core_trampoline, METH_NOARGS,
     "This thread's completion trampoline (a deque), or None."},
    {"set_trampoline", core_set_trampoline, METH_O,
     "Sets (a deque) or clears (None) this thread's completion trampoline."},
    {"complete", (PyCFunction)(void (*)(void))core_complete, METH_FASTCALL,
     "complete(signal, error): hal.queue.WorkQueue.complete, fast when nothing waits."},
    {"pending_fence", core_pending_fence, METH_NOARGS,
     "A fence of one new semaphore (at 0) reached at 1: what hal.fence.create makes."},
    {"reached_fence", core_reached_fence, METH_NOARGS,
     "A fence of one new semaphore already at 1: a queue operation that completed "
     "before its caller returned signals it."},
    {"join_fences", core_join_fences, METH_O,
     "A fence of every point of the given fences (Nones skipped), largest value per "
     "semaphore."},
    {"any_released", core_any_released, METH_O,
     "any_released(buffers): whether a Buffer of the list has released storage (True "
     "for anything that is not a Buffer)."},
    {"fences_reached", core_fences_reached, METH_O,
     "fences_reached(fences): whether every Fence (or None) of a list or tuple is reached "
     "with no failure; NotImplemented if an item is neither."},
    {"join_fence_rows", core_join_fence_rows, METH_O,
     "hal.fence.join over the VM's rows of one fence or None (see core.c)."},
    {"normalize_wait_signal", (PyCFunction)(void (*)(void))core_normalize_wait_signal,
     METH_FASTCALL, "See hal.semaphore.normalize_wait_signal."},
    {"adopt", (PyCFunction)(void (*)(void))core_adopt, METH_FASTCALL,
     "adopt(recording, needs, direct) -> Submission | None: the check of "
     "hal.execution.Recording.adopter."},
    {"bind_slots", (PyCFunction)(void (*)(void))core_bind_slots, METH_FASTCALL,
     "bind_slots(needs, table, direct, addresses, lengths, normalize) -> (entries, "
     "has_memory, ok): the pass of hal.execution.Recording.bind over the slots."},
    {NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = CORE_STR(TINYHAL_CORE_NAME),
    .m_doc = "The ready path of tinyhal's semaphores and fences (see core.c).",
    .m_size = -1,
    .m_methods = core_methods,
};

PyMODINIT_FUNC CORE_CAT(PyInit_, TINYHAL_CORE_NAME)(void)
{
    if (PyType_Ready(&SemaphoreCoreType) < 0 || PyType_Ready(&FenceCoreType) < 0
        || PyType_Ready(&StorageCoreType) < 0 || PyType_Ready(&RingStorageType) < 0
        || PyType_Ready(&BufferCoreType) < 0 || PyType_Ready(&BufferViewCoreType) < 0
        || PyType_Ready(&HeapCounterType) < 0 || PyType_Ready(&RingBlockType) < 0
        || PyType_Ready(&RingCoreType) < 0 || PyType_Ready(&SubmissionCoreType) < 0)
        return NULL;
    str_ensure_backing = PyUnicode_InternFromString("_ensure_backing");
    str_grant_parked = PyUnicode_InternFromString("_grant_parked");
    str_profile = PyUnicode_InternFromString("profile");
    str_block = PyUnicode_InternFromString("block");
    str_ring = PyUnicode_InternFromString("ring");
    str_array = PyUnicode_InternFromString("array");
    str_address = PyUnicode_InternFromString("address");
    str_byte_length = PyUnicode_InternFromString("byte_length");
    str_retire_later = PyUnicode_InternFromString("_retire_later");
    str_grant_later = PyUnicode_InternFromString("_grant_later");
    if (str_retire_later == NULL || str_grant_later == NULL)
        return NULL;
    zero = PyLong_FromLong(0);
    if (zero == NULL)
        return NULL;
    if (str_ensure_backing == NULL || str_grant_parked == NULL || str_profile == NULL
        || str_block == NULL || str_ring == NULL || str_array == NULL || str_address == NULL
        || str_byte_length == NULL)
        return NULL;
    PyObject *thread = PyImport_ImportModule("_thread");
    if (thread == NULL)
        return NULL;
    allocate_lock = PyObject_GetAttrString(thread, "allocate_lock");
    Py_DECREF(thread);
    empty_tuple = PyTuple_New(0);
    empty_str = PyUnicode_FromString("");
    str_advance_slow = PyUnicode_InternFromString("_advance_slow");
    str_collected = PyUnicode_InternFromString("collected");
    one = PyLong_FromLong(1);
    memory_access_all = PyLong_FromLong(MEMORY_ACCESS_ALL);
    PyObject *no_bytes = PyByteArray_FromStringAndSize(NULL, 0);
    empty_view = no_bytes == NULL ? NULL : PyMemoryView_FromObject(no_bytes);
    Py_XDECREF(no_bytes);
    if (allocate_lock == NULL || empty_tuple == NULL || empty_str == NULL
        || str_advance_slow == NULL || str_collected == NULL || one == NULL
        || memory_access_all == NULL || empty_view == NULL)
        return NULL;
    if (PyThread_tss_create(&trampoline_key) != 0)
        return NULL;
    PyObject *module = PyModule_Create(&core_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "SemaphoreCore", (PyObject *)&SemaphoreCoreType) < 0
        || PyModule_AddObjectRef(module, "FenceCore", (PyObject *)&FenceCoreType) < 0
        || PyModule_AddObjectRef(module, "StorageCore", (PyObject *)&StorageCoreType) < 0
        || PyModule_AddObjectRef(module, "RingStorage", (PyObject *)&RingStorageType) < 0
        || PyModule_AddObjectRef(module, "BufferCore", (PyObject *)&BufferCoreType) < 0
        || PyModule_AddObjectRef(module, "BufferViewCore", (PyObject *)&BufferViewCoreType) < 0
        || PyModule_AddObjectRef(module, "HeapCounter", (PyObject *)&HeapCounterType) < 0
        || PyModule_AddObjectRef(module, "RingBlock", (PyObject *)&RingBlockType) < 0
        || PyModule_AddObjectRef(module, "RingCore", (PyObject *)&RingCoreType) < 0
        || PyModule_AddObjectRef(module, "SubmissionCore", (PyObject *)&SubmissionCoreType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
