//! The forward pass of both algorithms matches the f64 reference.

mod common;
use common::{cfg, check_forward};

#[test]
fn single_query_and_single_key() {
    check_forward(&cfg(1, 1, 1, 1, 1, 16, false), 1.0);
}

#[test]
fn odd_lengths_match_reference() {
    for s in [17, 113, 203] {
        check_forward(&cfg(1, s, s, 2, 2, 64, false), 1.0);
    }
}

#[test]
fn causal_odd_lengths_match_reference() {
    for s in [1, 17, 113, 203] {
        check_forward(&cfg(1, s, s, 2, 2, 64, true), 1.0);
    }
}

#[test]
fn long_sequence_1000_matches_reference() {
    check_forward(&cfg(1, 1000, 1000, 1, 1, 64, false), 1.0);
    check_forward(&cfg(1, 1000, 1000, 1, 1, 32, true), 1.0);
}

#[test]
fn more_queries_than_keys() {
    check_forward(&cfg(1, 203, 17, 2, 2, 32, false), 1.0);
    check_forward(&cfg(1, 203, 17, 2, 2, 32, true), 1.0);
}

#[test]
fn more_keys_than_queries() {
    check_forward(&cfg(1, 17, 203, 2, 2, 32, false), 1.0);
    check_forward(&cfg(1, 17, 203, 2, 2, 32, true), 1.0);
}

#[test]
fn rows_with_no_visible_key_give_zero_and_neg_inf_lse() {
    // Bottom-right causal with seq_q > seq_kv: the first seq_q - seq_kv rows see nothing.
    check_forward(&cfg(2, 40, 9, 2, 1, 16, true), 1.0);
}

#[test]
fn grouped_query_attention() {
    check_forward(&cfg(2, 113, 113, 8, 2, 64, false), 1.0);
    check_forward(&cfg(1, 113, 77, 6, 3, 32, true), 1.0);
}

#[test]
fn multi_query_attention() {
    check_forward(&cfg(1, 113, 113, 4, 1, 64, true), 1.0);
}

#[test]
fn every_listed_head_dim() {
    for d in [16, 32, 64, 80, 96, 128, 256] {
        check_forward(&cfg(1, 67, 45, 2, 1, d, false), 1.0);
        check_forward(&cfg(1, 45, 67, 2, 2, d, true), 1.0);
    }
}

#[test]
fn odd_and_tiny_head_dims() {
    for d in [1, 3, 7, 9, 33, 127, 255] {
        check_forward(&cfg(1, 29, 31, 1, 1, d, true), 1.0);
    }
}

#[test]
fn batch_greater_than_one() {
    check_forward(&cfg(3, 57, 91, 2, 2, 64, false), 1.0);
}

#[test]
fn large_logits_stay_exact() {
    // inputs scaled by 8: logits in the hundreds, exp overflows without the running max
    check_forward(&cfg(1, 113, 113, 2, 2, 64, false), 8.0);
    check_forward(&cfg(1, 113, 113, 2, 2, 64, true), 8.0);
}

#[test]
fn explicit_softmax_scale_is_used() {
    let mut c = cfg(1, 33, 47, 2, 2, 32, false);
    c.softmax_scale = Some(0.37);
    check_forward(&c, 1.0);
}
