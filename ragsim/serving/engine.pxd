# Compiled, Job and Engine are extension types: their fields are struct members, read by
# offset in the engine's own code instead of looked up by name. Every field stays a Python
# object (the same values and arithmetic as uncompiled) and public (readable and settable
# from Python, as the drivers and tests do).

cdef class Job:
    cdef public object alpha
    cdef public object attributed_s
    cdef public object beta
    cdef public object blend_recomputed
    cdef public object computing
    cdef public object context_tokens
    cdef public object decision_s
    cdef public object doc_tokens
    cdef public object docs
    cdef public object done
    cdef public object finish_s
    cdef public object first_token_s
    cdef public object footprint_tokens
    cdef public object free_hit_tokens
    cdef public object free_nodes
    cdef public object generated
    cdef public object hit_gpu
    cdef public object hit_host
    cdef public object iter_at_join
    cdef public object key
    cdef public object output_tokens
    cdef public object path
    cdef public object prefill_start_s
    cdef public object prefilled
    cdef public object query_tokens
    cdef public object recomputed
    cdef public object request
    cdef public object reserved_bytes
    cdef public object self_hit_tokens
    cdef public object slot_at_join
    cdef public object speculative
    cdef public object swap_in_bytes
    cdef public object swap_in_s
    cdef public object terminated


cdef class EngineHooks:
    pass


cdef class Engine:
    cdef object __weakref__
    cdef public object _batch_computed
    cdef public object _context_sum
    cdef public object _current
    cdef public object _decode_durations
    cdef public object _decode_iter
    cdef public object _decoding
    cdef public object _finish_heap
    cdef public object _in_decode_run
    cdef public object _iterating
    cdef public object _parked
    cdef public object _prefilling
    cdef public object _recovering
    cdef public object _run_cut_steps
    cdef public object _run_ends
    cdef public object _slot_s
    cdef public object _speculated
    cdef public object _speculated_by
    cdef public object _terminate
    cdef public object _timeout_at
    cdef public object _wakeup
    cdef public object batch_kv_sharing
    cdef public object block
    cdef public object busy_s
    cdef public object down_until_s
    cdef public object env
    cdef public object gpu_failures
    cdef public object gpu_recovery_s
    cdef public object hooks
    cdef public object iterations
    cdef public object iterations_decode
    cdef public object iterations_mixed
    cdef public object prefills_over_budget
    cdef public object padded_apart
    cdef public object padded_price_s
    cdef public object iterations_prefill
    cdef public object kv
    cdef public object lost_bytes
    cdef public object max_batch_size
    cdef public object max_batched_tokens
    cdef public object max_prefill_bs
    cdef public object mixed
    cdef public object pool
    cdef public object process
    cdef public object scheduler_decisions
    cdef public object scheduler_s
    cdef public object swap_in_s
    cdef public object tree
