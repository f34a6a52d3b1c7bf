// SINKS: one logit per query head that joins every row's softmax (AttentionConfig::sinks;
// src/modifiers/sinks.rs). The head's sink is read by `begin_head` (head_sink2).

// The sink takes part in this row's softmax: on, and not a windowed call's later pass (its
// stored row already holds the sink's share).
fn sink_on() -> bool {
    return SINKS() && params.resume == 0u;
}
