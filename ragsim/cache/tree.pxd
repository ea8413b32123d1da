# C declarations of tree.py's node and policy hooks (Cython reads this beside tree.py).
#
# They live here, not in tree.py, so that the policies (compiled with their own .pxd) can
# cimport them: a policy then reads and writes node fields as C struct members, and the tree
# calls its hooks through a C vtable instead of a Python method call per retrieved node.
# Plain Python ignores this file; tree.py stays the source of behaviour.

cimport cython


@cython.final
cdef class Node:
    cdef public long long key
    cdef public object parent  # Node, or None for the root
    cdef public dict children  # None until the first child
    cdef public int depth
    cdef public long long tokens
    cdef public long long size_bytes
    cdef public bint in_gpu
    cdef public bint host_copy
    cdef public int gpu_children
    cdef public int cached_children
    cdef public int pins
    cdef public long long frequency
    cdef public double total_cost
    cdef public long long num_computed
    cdef public double value
    cdef public long long last_access
    cdef public double priority_gpu
    cdef public double priority_host
    cdef readonly Py_ssize_t gpu_pos  # -1: not a candidate
    cdef readonly Py_ssize_t host_pos


cdef class NodePolicy:
    cpdef void on_access(self, Node node, bint is_cached, double cost_per_token_s,
                         long long request_index, int depth)
    cpdef double value_of(self, Node node) except? -1
    cpdef void on_enter_cache(self, Node node, long long seq)
