# Compiled, the pipeline and the search pool are extension types (see engine.pxd): fields
# are struct members, every one a public Python object, as uncompiled.

from ragsim.serving.engine cimport EngineHooks


cdef class Pipeline(EngineHooks):
    cdef object __weakref__
    cdef public object _active_spec
    cdef public object _arrival_list
    cdef public object _arrival_wakeup
    cdef public object _ids
    cdef public object _next_key
    cdef public object _offsets
    cdef public object _output
    cdef public object _previous_ended
    cdef public object _query
    cdef public object _timeout_at
    cdef public object _tokens_by_id
    cdef public object _toks
    cdef public object all_ended
    cdef public object answers
    cdef public object arrival_s
    cdef public object arrived
    cdef public object config
    cdef public object ended
    cdef public object engine
    cdef public object env
    cdef public object extrapolated_before
    cdef public object kv
    cdef public object n
    cdef public object pool
    cdef public object profile
    cdef public object progress
    cdef public object r_attempts
    cdef public object r_cached
    cdef public object r_decision_s
    cdef public object r_finish
    cdef public object r_first_token
    cdef public object r_generated
    cdef public object r_hit_gpu
    cdef public object r_hit_host
    cdef public object r_prefill_start
    cdef public object r_reason
    cdef public object r_recomputed
    cdef public object r_free_hit
    cdef public object r_blend_recomputed
    cdef public object r_search_end
    cdef public object r_search_start
    cdef public object r_self_hit
    cdef public object r_spec_kept
    cdef public object r_spec_started
    cdef public object r_spec_wasted_s
    cdef public object r_status
    cdef public object r_swap_in
    cdef public object r_swap_in_s
    cdef public object retries
    cdef public object retrieval
    cdef public object retrieval_turned_off
    cdef public object search
    cdef public object spec_wasted_tokens
    cdef public object trace
    cdef public object tree
    cdef public object unseen_failures
    cdef public object workers


cdef class SearchWorkers:
    cdef public object _waiting
    cdef public object env
    cdef public object free
