/* tinyhal.hal.native._core: the ready path of semaphores and fences in C.
 *
 * Two base types, `SemaphoreCore` and `FenceCore`, hold the state of the Python classes
 * `hal.semaphore.Semaphore` and `Fence` (which subclass them and keep every rare path:
 * timepoints, offers, blocking and trio waits, failure). What is here is what a ready queue
 * operation pays for on every call: a semaphore advanced while nothing waits on it, the
 * one-point fence `hal.fence.create` makes, a join, and the check that a wait fence is
 * already reached.
 *
 * Atomicity. The fast paths rely on the GIL: each runs as one C call that never releases it
 * and calls no Python code between its checks and its writes, so no Python thread can run in
 * between. The Python slow paths keep the semaphore's protocol race-free against that: a
 * waiter registers itself (a timepoint, an offer, a blocked thread) under the semaphore's
 * lock *before* it reads the value, and `advance` takes the fast path only when nobody is
 * registered, else it hands over to the locked Python path. A free-threaded interpreter
 * would break this, so the module refuses to build for one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#ifdef Py_GIL_DISABLED
#error "tinyhal's _core relies on the GIL for its fast paths; it cannot be built for a free-threaded (Py_GIL_DISABLED) interpreter"
#endif

#ifndef TINYHAL_CORE_NAME
#define TINYHAL_CORE_NAME _core
#endif
#define CORE_CAT2(a, b) a##b
#define CORE_CAT(a, b) CORE_CAT2(a, b)
#define CORE_STR2(a) #a
#define CORE_STR(a) CORE_STR2(a)

/* What `bind` hands over from Python: the concrete classes made here, and the general
 * path of `normalize_wait_signal` for arguments the fast path does not take. */
static PyTypeObject *semaphore_class;
static PyTypeObject *fence_class;
static PyObject *normalize_general;
static PyObject *allocate_lock;
static PyObject *empty_tuple;
static PyObject *empty_str;
static PyObject *str_advance_slow;

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

static int semaphore_traverse(SemaphoreObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->failure);
    Py_VISIT(self->lock);
    Py_VISIT(self->cond);
    Py_VISIT(self->timepoints);
    Py_VISIT(self->offers);
    Py_VISIT(self->name);
    return 0;
}

static int semaphore_clear(SemaphoreObject *self)
{
    Py_CLEAR(self->failure);
    Py_CLEAR(self->lock);
    Py_CLEAR(self->cond);
    Py_CLEAR(self->timepoints);
    Py_CLEAR(self->offers);
    Py_CLEAR(self->name);
    return 0;
}

/* A Python subclass's own dealloc and traverse handle its (heap) type; these handle only
 * the fields. */
static void semaphore_dealloc(SemaphoreObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    semaphore_clear(self);
    type->tp_free((PyObject *)self);
}

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
    {"__weaklistoffset__", T_PYSSIZET, offsetof(SemaphoreObject, weakrefs), READONLY},
    {NULL},
};

static PyGetSetDef semaphore_getset[] = {
    {"_value", (getter)semaphore_get_value, (setter)semaphore_set_value, NULL, NULL},
    {"_lock", (getter)semaphore_get_lock, NULL, NULL, NULL},
    {NULL},
};

static PyTypeObject SemaphoreCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tinyhal.hal.native._core.SemaphoreCore",
    .tp_basicsize = sizeof(SemaphoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The state of a timeline semaphore and its fast paths (hal.semaphore.Semaphore).",
    .tp_new = semaphore_new,
    .tp_dealloc = (destructor)semaphore_dealloc,
    .tp_traverse = (traverseproc)semaphore_traverse,
    .tp_clear = (inquiry)semaphore_clear,
    .tp_methods = semaphore_methods,
    .tp_members = semaphore_members,
    .tp_getset = semaphore_getset,
    .tp_weaklistoffset = offsetof(SemaphoreObject, weakrefs),
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

static int fence_traverse(FenceObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->points);
    Py_VISIT(self->timeline);
    return 0;
}

static int fence_clear(FenceObject *self)
{
    Py_CLEAR(self->points);
    Py_CLEAR(self->timeline);
    return 0;
}

static void fence_dealloc(FenceObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    fence_clear(self);
    type->tp_free((PyObject *)self);
}

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

static PyMemberDef fence_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(FenceObject, weakrefs), READONLY},
    {NULL},
};

static PyTypeObject FenceCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tinyhal.hal.native._core.FenceCore",
    .tp_basicsize = sizeof(FenceObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The points of a fence (hal.semaphore.Fence): a tuple, and a dict made when asked.",
    .tp_new = fence_new,
    .tp_dealloc = (destructor)fence_dealloc,
    .tp_traverse = (traverseproc)fence_traverse,
    .tp_clear = (inquiry)fence_clear,
    .tp_as_sequence = &fence_as_sequence,
    .tp_getset = fence_getset,
    .tp_members = fence_members,
    .tp_weaklistoffset = offsetof(FenceObject, weakrefs),
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

static PyMethodDef core_methods[] = {
    {"bind", core_bind, METH_VARARGS,
     "bind(Semaphore, Fence, normalize_general): the classes this module makes, and the "
     "general path of normalize_wait_signal."},
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
    if (PyType_Ready(&SemaphoreCoreType) < 0 || PyType_Ready(&FenceCoreType) < 0)
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
    PyObject *module = PyModule_Create(&core_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&SemaphoreCoreType);
    Py_INCREF(&FenceCoreType);
    if (PyModule_AddObject(module, "SemaphoreCore", (PyObject *)&SemaphoreCoreType) < 0
        || PyModule_AddObject(module, "FenceCore", (PyObject *)&FenceCoreType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
