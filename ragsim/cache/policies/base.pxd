# C declaration of base.py's TreePolicy, so that compiled policies can derive from it (see
# ragsim/cache/tree.pxd for the hooks it inherits).

from ragsim.cache.tree cimport NodePolicy


cdef class TreePolicy(NodePolicy):
    pass
