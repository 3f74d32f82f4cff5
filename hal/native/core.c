/* tinyhal.hal.native._core: the ready path of semaphores, fences and the transient ring.
 *
 * Base types hold the state of Python classes, which subclass them and keep every rare
 * path: `SemaphoreCore` (hal.semaphore.Semaphore: timepoints, offers, blocking and trio
 * waits and failure stay in Python), `FenceCore` (Fence) and `RingCore`
 * (hal.ringbuffer.TransientRingbuffer: parked requests, grants, close and collection stay
 * in Python); `HeapCounter` and `RingBlock` are plain C types. What is here is what a
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

/* What `bind` hands over from Python: the concrete classes made here, and the general
 * path of `normalize_wait_signal` for arguments the fast path does not take. */
static PyTypeObject *semaphore_class;
static PyTypeObject *fence_class;
static PyObject *normalize_general;
static PyObject *allocate_lock;
static PyObject *empty_tuple;
static PyObject *empty_str;
static PyObject *str_advance_slow;

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

static void semaphore_init_fields(SemaphoreObject *self)
{
    self->value = 0;
    Py_INCREF(empty_tuple);
    self->timepoints = empty_tuple;
    Py_INCREF(empty_tuple);
    self->offers = empty_tuple;
    Py_INCREF(empty_str);
    self->name = empty_str;
}

static PyObject *semaphore_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    SemaphoreObject *self = (SemaphoreObject *)type->tp_alloc(type, 0);
    if (self != NULL)
        semaphore_init_fields(self);
    return (PyObject *)self;
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

static PyObject *fence_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    FenceObject *self = (FenceObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        Py_INCREF(empty_tuple);
        self->points = empty_tuple;
    }
    return (PyObject *)self;
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

static int fence_set_points(FenceObject *self, PyObject *value, void *closure)
{
    if (value == NULL || !PyTuple_CheckExact(value)) {
        PyErr_SetString(PyExc_TypeError, "a fence's points are a tuple");
        return -1;
    }
    Py_INCREF(value);
    Py_SETREF(self->points, value);
    Py_CLEAR(self->timeline);
    return 0;
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
    {"_points", (getter)fence_get_points, (setter)fence_set_points, NULL, NULL},
    {NULL},
};

static PyTypeObject FenceCoreType = {
    CORE_BASE_TYPE("FenceCore", FenceObject, fence,
                   "The points of a fence (hal.semaphore.Fence): a tuple, and a dict made "
                   "when asked."),
    .tp_as_sequence = &fence_as_sequence,
    .tp_getset = fence_getset,
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

typedef struct {
    PyObject_HEAD
    long long capacity, head, tail, live, peak, reservations, waits, backing_address;
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
    PyObject *weakrefs;
} RingObject;

static PyObject *str_ensure_backing, *str_grant_parked, *str_profile;
static PyObject *str_block, *str_ring, *str_array, *str_address, *str_byte_length;
static PyTypeObject *ring_storage_class;

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

/* Room for `size` bytes at the head, wrapping to 0 (lock held): a new block, NULL with no
 * exception when it does not fit (now), NULL with one on error. */
static RingBlockObject *ring_place(RingObject *self, long long size)
{
    if (size < 0 || size > self->capacity) /* never fits: the caller's check names it */
        return NULL;
    long long need = ((size + RING_ALIGNMENT - 1) & ~(long long)(RING_ALIGNMENT - 1));
    if (need == 0)
        need = RING_ALIGNMENT; /* never empty: head == tail means full */
    long long offset;
    if (self->blocks_count == 0) { /* head and tail are 0 */
        if (need > self->capacity)
            return NULL;
        offset = 0;
        if (!present(self->backing)) {
            PyObject *made = PyObject_CallMethodNoArgs((PyObject *)self, str_ensure_backing);
            if (made == NULL)
                return NULL;
            Py_DECREF(made);
        }
    } else if (self->head > self->tail) {
        if (self->head + need <= self->capacity)
            offset = self->head;
        else if (need <= self->tail)
            offset = 0; /* wrap; [head, capacity) stays unused until the tail passes it */
        else
            return NULL;
    } else if (self->head + need <= self->tail) { /* wrapped: live is [tail, cap) + [0, head) */
        offset = self->head;
    } else {
        return NULL;
    }
    RingBlockObject *block = PyObject_New(RingBlockObject, &RingBlockType);
    if (block == NULL)
        return NULL;
    block->offset = offset;
    block->size = need;
    block->requested = size;
    block->retired = 0;
    if (ring_push(self, block) < 0) {
        Py_DECREF(block);
        return NULL;
    }
    Py_INCREF(block); /* one for the ring, one for the caller */
    self->head = offset + need;
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
    while (self->blocks_count && ring_front(self)->retired)
        ring_pop_front(self);
    if (self->blocks_count)
        self->tail = ring_front(self)->offset;
    else
        self->head = self->tail = 0;
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

/* Slots of the Python classes this module fills (RingStorage, Buffer): the offsets of
 * their `__slots__` members, read once from the classes' member descriptors at
 * `bind_ring`, so a field is one store rather than an attribute lookup. */
enum {
    STORAGE_ARRAY, STORAGE_ADDRESS, STORAGE_BYTE_LENGTH, STORAGE_RELEASED, STORAGE_ON_RELEASE,
    STORAGE_RING, STORAGE_BLOCK, STORAGE_SLOTS
};
enum {
    BUFFER_ALLOCATOR, BUFFER_STORAGE, BUFFER_BYTE_OFFSET, BUFFER_BYTE_LENGTH,
    BUFFER_MEMORY_TYPE_BITS, BUFFER_USAGE_BITS, BUFFER_ACCESS_BITS, BUFFER_SLOTS
};
static const char *const storage_slot_names[STORAGE_SLOTS] = {
    "array", "address", "byte_length", "released", "_on_release", "ring", "block"};
static const char *const buffer_slot_names[BUFFER_SLOTS] = {
    "allocator", "storage", "byte_offset", "byte_length", "memory_type_bits", "usage_bits",
    "access_bits"};
static Py_ssize_t storage_slots[STORAGE_SLOTS], buffer_slots[BUFFER_SLOTS];

static int find_slots(PyTypeObject *type, const char *const *names, Py_ssize_t *offsets,
                      int count)
{
    for (int i = 0; i < count; i++) {
        PyObject *descr = PyObject_GetAttrString((PyObject *)type, names[i]);
        if (descr == NULL)
            return -1;
        int ok = Py_TYPE(descr) == &PyMemberDescr_Type;
        if (ok) {
            PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
            ok = member->type == T_OBJECT_EX && !(member->flags & READONLY);
            offsets[i] = member->offset;
        }
        Py_DECREF(descr);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a writable __slots__ member",
                         type->tp_name, names[i]);
            return -1;
        }
    }
    return 0;
}

static inline PyObject **slot_at(PyObject *object, Py_ssize_t offset)
{
    return (PyObject **)((char *)object + offset);
}

/* Stores a new reference to `value` in the slot (the old value released after). */
static inline void set_slot(PyObject *object, Py_ssize_t offset, PyObject *value)
{
    PyObject **slot = slot_at(object, offset), *old = *slot;
    Py_INCREF(value);
    *slot = value;
    Py_XDECREF(old);
}

/* The slot's value (borrowed), None if unset. */
static inline PyObject *get_slot(PyObject *object, Py_ssize_t offset)
{
    PyObject *value = *slot_at(object, offset);
    return value == NULL ? Py_None : value;
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
    if (Py_TYPE(storage) == ring_storage_class) {
        set_slot(storage, storage_slots[STORAGE_ARRAY], array);
        set_slot(storage, storage_slots[STORAGE_ADDRESS], address);
        set_slot(storage, storage_slots[STORAGE_RING], (PyObject *)self);
        set_slot(storage, storage_slots[STORAGE_BLOCK], (PyObject *)block);
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

static PyTypeObject *buffer_class;
static PyObject *access_all, *zero;

/* A transient buffer of `size` bytes over a new RingStorage committed to a block placed
 * now (`pending_buffer` and `try_commit` in one call), or None when the ring has no room
 * now, a request is parked ahead, or the ring is closed (the caller queues the alloca). */
static PyObject *ring_commit_new(RingObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "commit_new(allocator, size, memory_type_bits, usage_bits)");
        return NULL;
    }
    if (ring_storage_class == NULL || buffer_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "tinyhal _core used before bind_ring()");
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
    PyObject *storage = ring_storage_class->tp_alloc(ring_storage_class, 0);
    if (storage == NULL)
        return NULL;
    set_slot(storage, storage_slots[STORAGE_BYTE_LENGTH], size);
    set_slot(storage, storage_slots[STORAGE_RELEASED], Py_False);
    set_slot(storage, storage_slots[STORAGE_ON_RELEASE], Py_None);
    set_slot(storage, storage_slots[STORAGE_RING], Py_None);
    set_slot(storage, storage_slots[STORAGE_BLOCK], Py_None);
    int committed = ring_commit_if_room(self, storage, length);
    if (committed <= 0) {
        Py_DECREF(storage); /* a committed block goes back through its collection */
        if (committed == 0 && !PyErr_Occurred())
            Py_RETURN_NONE;
        return NULL;
    }
    PyObject *buffer = buffer_class->tp_alloc(buffer_class, 0);
    if (buffer == NULL) {
        Py_DECREF(storage);
        return NULL;
    }
    PyObject *values[BUFFER_SLOTS] = {args[0], storage, zero, size, args[2], args[3],
                                      access_all};
    for (int i = 0; i < BUFFER_SLOTS; i++)
        set_slot(buffer, buffer_slots[i], values[i]);
    Py_DECREF(storage);
    return buffer;
}

static PyObject *ring_release(RingObject *self, PyObject *storage)
{
    if (ring_storage_class == NULL || Py_TYPE(storage) != ring_storage_class
        || get_slot(storage, storage_slots[STORAGE_RING]) != (PyObject *)self)
        Py_RETURN_NONE;
    if (ring_lock(self) < 0)
        return NULL;
    PyObject *grants = NULL;
    PyObject *block = get_slot(storage, storage_slots[STORAGE_BLOCK]);
    if (block == Py_None) {
        Py_INCREF(empty_tuple);
        grants = empty_tuple;
    } else if (!PyObject_TypeCheck(block, &RingBlockType)) {
        PyErr_Format(PyExc_TypeError, "not a RingBlock: %R", block);
    } else {
        Py_INCREF(block);
        set_slot(storage, storage_slots[STORAGE_BLOCK], Py_None);
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
    return PyBool_FromLong(ring_storage_class != NULL && Py_TYPE(storage) == ring_storage_class
                           && get_slot(storage, storage_slots[STORAGE_RING]) == (PyObject *)self
                           && get_slot(storage, storage_slots[STORAGE_BLOCK]) != Py_None);
}

static PyObject *ring_live_blocks(RingObject *self, PyObject *unused)
{
    Py_ssize_t live = 0;
    for (Py_ssize_t i = 0; i < self->blocks_count; i++)
        live += !self->blocks[(self->blocks_start + i) % self->blocks_capacity]->retired;
    return PyLong_FromSsize_t(live);
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
    {NULL},
};

static PyMemberDef ring_members[] = {
    {"capacity", T_LONGLONG, offsetof(RingObject, capacity), 0, NULL},
    {"_head", T_LONGLONG, offsetof(RingObject, head), READONLY, NULL},
    {"_tail", T_LONGLONG, offsetof(RingObject, tail), READONLY, NULL},
    {"_live", T_LONGLONG, offsetof(RingObject, live), READONLY, NULL},
    {"_peak", T_LONGLONG, offsetof(RingObject, peak), READONLY, NULL},
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
/* Module functions                                                                   */

static int check_bound(void)
{
    if (semaphore_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "tinyhal _core used before bind()");
        return -1;
    }
    return 0;
}

static PyObject *make_fence(PyObject *points)
{
    FenceObject *fence = (FenceObject *)fence_class->tp_alloc(fence_class, 0);
    if (fence == NULL) {
        Py_DECREF(points);
        return NULL;
    }
    fence->points = points; /* stolen */
    return (PyObject *)fence;
}

static PyObject *new_semaphore(void)
{
    SemaphoreObject *sem = (SemaphoreObject *)semaphore_class->tp_alloc(semaphore_class, 0);
    if (sem != NULL)
        semaphore_init_fields(sem);
    return (PyObject *)sem;
}

static PyObject *one;

static PyObject *core_pending_fence(PyObject *module, PyObject *unused)
{
    if (check_bound() < 0)
        return NULL;
    PyObject *sem = new_semaphore();
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
    return make_fence(points);
}

/* Merges the points of `fence` into `timeline` (largest value per semaphore). */
static int merge_points(PyObject *timeline, PyObject *fence)
{
    PyObject *points = ((FenceObject *)fence)->points;
    Py_ssize_t n = PyTuple_GET_SIZE(points);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *point = PyTuple_GET_ITEM(points, i);
        PyObject *sem = PyTuple_GET_ITEM(point, 0), *value = PyTuple_GET_ITEM(point, 1);
        PyObject *old = PyDict_GetItemWithError(timeline, sem);
        if (old == NULL && PyErr_Occurred())
            return -1;
        if (old != NULL) {
            int larger = PyObject_RichCompareBool(value, old, Py_GT);
            if (larger < 0)
                return -1;
            if (!larger)
                continue;
        }
        if (PyDict_SetItem(timeline, sem, value) < 0)
            return -1;
    }
    return 0;
}

/* A fence of `timeline`'s points (stolen). */
static PyObject *fence_of_timeline(PyObject *timeline)
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
    PyObject *fence = make_fence(points);
    if (fence == NULL) {
        Py_DECREF(timeline);
        return NULL;
    }
    ((FenceObject *)fence)->timeline = timeline;
    return fence;
}

static PyObject *core_join_fences(PyObject *module, PyObject *fences)
{
    if (check_bound() < 0)
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
    return fence_of_timeline(timeline);
}

/* `hal.fence.join` on the VM's rows (a list of 1-tuples, each a fence or None): the one
 * fence with points among them as it is (a fence never changes), a new joined fence, or
 * None when no row has a point (IREE's null fence). NotImplemented if a row is neither a
 * fence nor None (the caller raises its own error). */
static PyObject *core_join_fence_rows(PyObject *module, PyObject *rows)
{
    if (check_bound() < 0)
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
    return fence_of_timeline(timeline);
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

static PyObject *core_normalize_wait_signal(PyObject *module, PyObject *const *args,
                                            Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "normalize_wait_signal(wait, signal)");
        return NULL;
    }
    PyObject *wait = args[0], *signal = args[1];
    if (check_bound() < 0)
        return NULL;
    if (Py_TYPE(signal) == fence_class) {
        PyObject *signal_points = ((FenceObject *)signal)->points;
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
static PyObject *complete_slow;

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
        PyErr_SetString(PyExc_RuntimeError, "tinyhal _core used before bind_queue()");
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

static PyObject *core_bind_queue(PyObject *module, PyObject *slow)
{
    Py_INCREF(slow);
    Py_XSETREF(complete_slow, slow);
    Py_RETURN_NONE;
}

static PyObject *core_bind(PyObject *module, PyObject *args)
{
    PyObject *sem_class, *fence_type, *general;
    if (!PyArg_ParseTuple(args, "O!O!O:bind", &PyType_Type, &sem_class, &PyType_Type,
                          &fence_type, &general))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)sem_class, &SemaphoreCoreType)
        || !PyType_IsSubtype((PyTypeObject *)fence_type, &FenceCoreType)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes subclasses of SemaphoreCore and FenceCore");
        return NULL;
    }
    Py_INCREF(sem_class);
    Py_XSETREF(semaphore_class, (PyTypeObject *)sem_class);
    Py_INCREF(fence_type);
    Py_XSETREF(fence_class, (PyTypeObject *)fence_type);
    Py_INCREF(general);
    Py_XSETREF(normalize_general, general);
    Py_RETURN_NONE;
}

static PyObject *core_bind_ring(PyObject *module, PyObject *args)
{
    PyObject *storage_type, *buffer_type, *access;
    if (!PyArg_ParseTuple(args, "O!O!O:bind_ring", &PyType_Type, &storage_type, &PyType_Type,
                          &buffer_type, &access))
        return NULL;
    if (find_slots((PyTypeObject *)storage_type, storage_slot_names, storage_slots,
                   STORAGE_SLOTS) < 0
        || find_slots((PyTypeObject *)buffer_type, buffer_slot_names, buffer_slots,
                      BUFFER_SLOTS) < 0)
        return NULL;
    Py_INCREF(storage_type);
    Py_XSETREF(ring_storage_class, (PyTypeObject *)storage_type);
    Py_INCREF(buffer_type);
    Py_XSETREF(buffer_class, (PyTypeObject *)buffer_type);
    Py_INCREF(access);
    Py_XSETREF(access_all, access);
    Py_RETURN_NONE;
}

static PyMethodDef core_methods[] = {
    {"bind_ring", core_bind_ring, METH_VARARGS,
     "bind_ring(RingStorage, Buffer, access_all): the classes of the transient buffers "
     "RingCore makes and releases, and the access bits they carry."},
    {"bind", core_bind, METH_VARARGS,
     "bind(Semaphore, Fence, normalize_general): the classes this module makes, and the "
     "general path of normalize_wait_signal."},
    {"trampoline", core_trampoline, METH_NOARGS,
     "This thread's completion trampoline (a deque), or None."},
    {"set_trampoline", core_set_trampoline, METH_O,
     "Sets (a deque) or clears (None) this thread's completion trampoline."},
    {"complete", (PyCFunction)(void (*)(void))core_complete, METH_FASTCALL,
     "complete(signal, error): hal.queue.WorkQueue.complete, fast when nothing waits."},
    {"bind_queue", core_bind_queue, METH_O,
     "bind_queue(complete_slow): the Python path of complete."},
    {"pending_fence", core_pending_fence, METH_NOARGS,
     "A fence of one new semaphore (at 0) reached at 1: what hal.fence.create makes."},
    {"join_fences", core_join_fences, METH_O,
     "A fence of every point of the given fences (Nones skipped), largest value per "
     "semaphore."},
    {"join_fence_rows", core_join_fence_rows, METH_O,
     "hal.fence.join over the VM's rows of one fence or None (see core.c)."},
    {"normalize_wait_signal", (PyCFunction)(void (*)(void))core_normalize_wait_signal,
     METH_FASTCALL, "See hal.semaphore.normalize_wait_signal."},
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
        || PyType_Ready(&HeapCounterType) < 0 || PyType_Ready(&RingBlockType) < 0
        || PyType_Ready(&RingCoreType) < 0)
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
    one = PyLong_FromLong(1);
    if (allocate_lock == NULL || empty_tuple == NULL || empty_str == NULL
        || str_advance_slow == NULL || one == NULL)
        return NULL;
    if (PyThread_tss_create(&trampoline_key) != 0)
        return NULL;
    PyObject *module = PyModule_Create(&core_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "SemaphoreCore", (PyObject *)&SemaphoreCoreType) < 0
        || PyModule_AddObjectRef(module, "FenceCore", (PyObject *)&FenceCoreType) < 0
        || PyModule_AddObjectRef(module, "HeapCounter", (PyObject *)&HeapCounterType) < 0
        || PyModule_AddObjectRef(module, "RingBlock", (PyObject *)&RingBlockType) < 0
        || PyModule_AddObjectRef(module, "RingCore", (PyObject *)&RingCoreType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
