# C declarations of lfu.py's tree policies: they override the tree's per-node hooks in C
# (see ragsim/cache/tree.pxd). Plain Python ignores this file.

from ragsim.cache.policies.base cimport TreePolicy
from ragsim.cache.tree cimport Node


cdef class LFU(TreePolicy):
    cpdef void on_access(self, Node node, bint is_cached, double cost_per_token_s,
                         long long request_index, int depth)
    cpdef double value_of(self, Node node) except? -1
