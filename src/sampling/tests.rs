use std::collections::HashMap;

use mlx_rs::Array;

use super::filters;
use super::keys::KeyStream;
use super::processors::process;
use super::{log_softmax, Sampler, SamplingParams};

fn row(values: &[f32]) -> Array {
    Array::from_slice(values, &[1, values.len() as i32])
}

fn values(a: &Array) -> Vec<f32> {
    a.as_dtype(mlx_rs::Dtype::Float32)
        .unwrap()
        .as_slice::<f32>()
        .to_vec()
}

fn kept(a: &Array) -> Vec<usize> {
    values(a)
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, _)| i)
        .collect()
}

fn logprobs(probs: &[f32]) -> Array {
    let logs: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
    log_softmax(&row(&logs)).unwrap()
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_the_mass() {
    let lp = logprobs(&[0.5, 0.3, 0.15, 0.05]);
    assert_eq!(kept(&filters::top_p(&lp, 0.5).unwrap()), vec![0]);
    assert_eq!(kept(&filters::top_p(&lp, 0.7).unwrap()), vec![0, 1]);
    assert_eq!(kept(&filters::top_p(&lp, 0.9).unwrap()), vec![0, 1, 2]);
    assert_eq!(kept(&filters::top_p(&lp, 1.0).unwrap()), vec![0, 1, 2, 3]);
}

#[test]
fn top_p_keeps_every_token_tied_at_the_threshold() {
    let lp = logprobs(&[0.4, 0.2, 0.2, 0.2]);
    assert_eq!(kept(&filters::top_p(&lp, 0.5).unwrap()), vec![0, 1, 2, 3]);
}

#[test]
fn min_p_with_one_survivor_and_a_minimum_to_keep() {
    let lp = logprobs(&[0.9, 0.05, 0.03, 0.02]);
    assert_eq!(kept(&filters::min_p(&lp, 0.5, 1).unwrap()), vec![0]);
    assert_eq!(kept(&filters::min_p(&lp, 0.5, 3).unwrap()), vec![0, 1, 2]);
    assert_eq!(
        kept(&filters::min_p(&lp, 0.0, 1).unwrap()),
        vec![0, 1, 2, 3]
    );
}

#[test]
fn top_k_keeps_exactly_k_and_everything_past_the_vocabulary() {
    let lp = logprobs(&[0.1, 0.4, 0.3, 0.2]);
    assert_eq!(kept(&filters::top_k(&lp, 2).unwrap()), vec![1, 2]);
    assert_eq!(kept(&filters::top_k(&lp, 4).unwrap()).len(), 4);
    assert_eq!(kept(&filters::top_k(&lp, 100).unwrap()).len(), 4);
    let tied = logprobs(&[0.25, 0.25, 0.25, 0.25]);
    assert_eq!(kept(&filters::top_k(&tied, 3).unwrap()).len(), 3);
}

#[test]
fn xtc_removes_top_choices_but_the_least_of_them_and_special_tokens() {
    let lp = logprobs(&[0.5, 0.3, 0.15, 0.05]);
    let key = mlx_rs::random::key(0).unwrap();
    let always = filters::xtc(&lp, 1.0, 0.1, &[], &key).unwrap();
    assert_eq!(kept(&always), vec![2, 3]);
    let special = filters::xtc(&lp, 1.0, 0.1, &[0], &key).unwrap();
    assert_eq!(kept(&special), vec![0, 2, 3]);
    let never = filters::xtc(&lp, 0.0, 0.1, &[], &key).unwrap();
    assert_eq!(kept(&never), vec![0, 1, 2, 3]);
}

#[test]
fn penalties_follow_their_windows() {
    let params = SamplingParams {
        presence_penalty: 1.0,
        presence_context_size: 3,
        ..SamplingParams::default()
    };
    // Window [2, 2, 3]: tokens 2 and 3 lose 1 each, once.
    let out = process(&params, row(&[0.0; 5]), &[1, 2, 2, 3]).unwrap();
    assert_eq!(values(&out), vec![0.0, 0.0, -1.0, -1.0, 0.0]);
    let params = SamplingParams {
        frequency_penalty: 0.5,
        frequency_context_size: 3,
        ..SamplingParams::default()
    };
    let out = process(&params, row(&[0.0; 5]), &[1, 2, 2, 3]).unwrap();
    assert_eq!(values(&out), vec![0.0, 0.0, -1.0, -0.5, 0.0]);
    let params = SamplingParams {
        repetition_penalty: Some(2.0),
        repetition_context_size: 2,
        ..SamplingParams::default()
    };
    let out = process(&params, row(&[4.0, -4.0, 4.0, 4.0]), &[0, 1, 2]).unwrap();
    assert_eq!(values(&out), vec![4.0, -8.0, 2.0, 4.0]);
}

#[test]
fn bias_comes_before_the_repetition_penalty() {
    let mut bias = HashMap::new();
    bias.insert(0, 2.0);
    let params = SamplingParams {
        logit_bias: bias,
        repetition_penalty: Some(2.0),
        ..SamplingParams::default()
    };
    // (-1 + 2) / 2, not (-1 * 2) + 2.
    let out = process(&params, row(&[-1.0, 0.0]), &[0]).unwrap();
    assert_eq!(values(&out)[0], 0.5);
}

#[test]
fn key_stream_splits_as_mlx_does() {
    let mut a = KeyStream::new(7, 0).unwrap();
    a.next().unwrap();
    a.next().unwrap();
    let mut b = KeyStream::new(7, 2).unwrap();
    let (x, y) = (a.next().unwrap(), b.next().unwrap());
    assert_eq!(x.as_slice::<u32>(), y.as_slice::<u32>());
    let (first, _) = mlx_rs::random::split(mlx_rs::random::key(7).unwrap(), 2).unwrap();
    let (_, draw) = mlx_rs::random::split(&first, 2).unwrap();
    let mut c = KeyStream::new(7, 1).unwrap();
    assert_eq!(c.next().unwrap().as_slice::<u32>(), draw.as_slice::<u32>());
}

fn draws(seed: Option<u64>, n: usize) -> Vec<u32> {
    let params = SamplingParams {
        temperature: 1.0,
        seed,
        ..SamplingParams::default()
    };
    let mut sampler = Sampler::new(params).unwrap();
    let lp = logprobs(&[0.2; 5]);
    (0..n)
        .map(|_| sampler.sample(&lp).unwrap().item_cast::<u32>())
        .collect()
}

#[test]
fn a_seed_fixes_the_draws() {
    assert_eq!(draws(Some(3), 16), draws(Some(3), 16));
    assert_ne!(draws(Some(3), 16), draws(Some(4), 16));
}
