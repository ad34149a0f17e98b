//! Each tensor-parallel layer, split over two ranks (threads), computes what the full single-rank layer computes,
//! forward and backward, including the gradient of its input.

use candle_core::{Device, Module, Tensor, Var};
use candle_nn::Activation;

use crate::TensorGroup;
use crate::testing::run_ranks;
use crate::tp::{ColumnParallelLinear, MlpWeights, ParallelMlp, RowParallelLinear};

fn pattern(salt: usize, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + salt * 13) % 23) as f32 * 0.1 - 1.1)
        .collect();
    Tensor::from_vec(v, dims, &Device::Cpu).expect("pattern")
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().and_then(|t| t.to_vec1()).expect("values")
}

fn assert_close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    for (g, w) in values(got).iter().zip(values(want)) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}: {got} vs {want}"
        );
    }
}

fn var(t: &Tensor) -> Var {
    Var::from_tensor(t).expect("var")
}

/// `Σ y ⊙ c`: a loss whose gradient with respect to `y` is `c`, different for every element.
fn loss(y: &Tensor, c: &Tensor) -> Tensor {
    (y * c).and_then(|t| t.sum_all()).expect("loss")
}

fn grad(grads: &candle_core::backprop::GradStore, v: &Var) -> Tensor {
    grads.get(v.as_tensor()).expect("gradient").clone()
}

/// The tp rank within `{0, 1}` / `{2, 3}`.
fn tp_rank(rank: usize) -> usize {
    rank % 2
}

#[test]
fn column_parallel_matches_the_full_layer() {
    let (w, b, x, c) = (
        pattern(1, &[6, 5]),
        pattern(2, &[6]),
        pattern(3, &[4, 5]),
        pattern(4, &[4, 6]),
    );
    let (wv, bv, xv) = (var(&w), var(&b), var(&x));
    let y = xv
        .as_tensor()
        .matmul(&wv.as_tensor().t().expect("t"))
        .and_then(|y| y.broadcast_add(bv.as_tensor()));
    let y = y.expect("full forward");
    let grads = loss(&y, &c).backward().expect("backward");
    let (gw, gb, gx) = (grad(&grads, &wv), grad(&grads, &bv), grad(&grads, &xv));
    run_ranks(4, 2, move |rank, pgc| {
        let tp = TensorGroup::kind(&pgc, "tp").expect("tp");
        let r = tp_rank(rank);
        let layer = ColumnParallelLinear::from_full(&w, Some(&b), tp).expect("layer");
        assert_close(
            layer.weight().as_tensor(),
            &w.narrow(0, 3 * r, 3).expect("w"),
            "weight shard",
        );
        let x = var(&x);
        let out = layer.forward(x.as_tensor()).expect("forward");
        assert_close(&out, &y.narrow(1, 3 * r, 3).expect("y"), "output slice");
        let grads = loss(&out, &c.narrow(1, 3 * r, 3).expect("c"))
            .backward()
            .expect("backward");
        assert_close(
            &grad(&grads, layer.weight()),
            &gw.narrow(0, 3 * r, 3).expect("gw"),
            "weight grad",
        );
        assert_close(
            &grad(&grads, &layer.vars()[1]),
            &gb.narrow(0, 3 * r, 3).expect("gb"),
            "bias grad",
        );
        // The input's gradient is summed over the group by copy_to_tp_region's backward.
        assert_close(&grad(&grads, &x), &gx, "input grad");
    });
}

#[test]
fn row_parallel_matches_the_full_layer() {
    let (w, b, x, c) = (
        pattern(5, &[3, 8]),
        pattern(6, &[3]),
        pattern(7, &[2, 8]),
        pattern(8, &[2, 3]),
    );
    let (wv, bv, xv) = (var(&w), var(&b), var(&x));
    let y = xv
        .as_tensor()
        .matmul(&wv.as_tensor().t().expect("t"))
        .and_then(|y| y.broadcast_add(bv.as_tensor()));
    let y = y.expect("full forward");
    let grads = loss(&y, &c).backward().expect("backward");
    let (gw, gb, gx) = (grad(&grads, &wv), grad(&grads, &bv), grad(&grads, &xv));
    run_ranks(4, 2, move |rank, pgc| {
        let tp = TensorGroup::kind(&pgc, "tp").expect("tp");
        let r = tp_rank(rank);
        let layer = RowParallelLinear::from_full(&w, Some(&b), tp).expect("layer");
        let x = var(&x.narrow(1, 4 * r, 4).expect("x slice"));
        let out = layer.forward(x.as_tensor()).expect("forward");
        assert_close(&out, &y, "full output");
        let grads = loss(&out, &c).backward().expect("backward");
        assert_close(
            &grad(&grads, layer.weight()),
            &gw.narrow(1, 4 * r, 4).expect("gw"),
            "weight grad",
        );
        assert_close(&grad(&grads, layer.bias().expect("bias")), &gb, "bias grad");
        assert_close(
            &grad(&grads, &x),
            &gx.narrow(1, 4 * r, 4).expect("gx"),
            "input slice grad",
        );
    });
}

#[test]
fn parallel_mlp_matches_the_full_block() {
    let (w1, b1) = (pattern(9, &[8, 5]), pattern(10, &[8]));
    let (w2, b2) = (pattern(11, &[3, 8]), pattern(12, &[3]));
    let (x, c) = (pattern(13, &[2, 4, 5]), pattern(14, &[2, 4, 3]));
    let full = [&w1, &b1, &w2, &b2, &x].map(var);
    let [w1v, b1v, w2v, b2v, xv] = &full;
    let linear = |x: &Tensor, w: &Var, b: &Var| {
        candle_nn::Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone())).forward(x)
    };
    let hidden = linear(xv.as_tensor(), w1v, b1v).and_then(|h| Activation::Silu.forward(&h));
    let y = hidden
        .and_then(|h| linear(&h, w2v, b2v))
        .expect("full forward");
    let grads = loss(&y, &c).backward().expect("backward");
    let g = full.clone().map(|v| grad(&grads, &v));
    run_ranks(4, 2, move |rank, pgc| {
        let tp = TensorGroup::kind(&pgc, "tp").expect("tp");
        let r = tp_rank(rank);
        let weights = MlpWeights {
            fc1_weight: &w1,
            fc1_bias: Some(&b1),
            fc2_weight: &w2,
            fc2_bias: Some(&b2),
        };
        let mlp = ParallelMlp::from_full(weights, Activation::Silu, tp).expect("mlp");
        let x = var(&x);
        let out = mlp.forward(x.as_tensor()).expect("forward");
        assert_close(&out, &y, "output");
        let grads = loss(&out, &c).backward().expect("backward");
        let vars = mlp.vars();
        let want = [
            g[0].narrow(0, 4 * r, 4).expect("fc1 w"),
            g[1].narrow(0, 4 * r, 4).expect("fc1 b"),
            g[2].narrow(1, 4 * r, 4).expect("fc2 w"),
            g[3].clone(),
        ];
        for (i, (v, want)) in vars.iter().zip(&want).enumerate() {
            assert_close(&grad(&grads, v), want, &format!("gradient of variable {i}"));
        }
        assert_close(&grad(&grads, &x), &g[4], "input grad");
    });
}

#[test]
fn a_weight_the_group_cannot_split_is_an_error() {
    run_ranks(2, 2, |_, pgc| {
        let tp = TensorGroup::kind(&pgc, "tp").expect("tp");
        let err = ColumnParallelLinear::from_full(&pattern(0, &[5, 4]), None, tp.clone())
            .expect_err("5 rows");
        assert!(
            err.to_string()
                .contains("has 5 along dim 0, not a multiple of 2 ranks"),
            "{err}"
        );
        let err = RowParallelLinear::from_full(&pattern(0, &[4, 4]), Some(&pattern(0, &[3])), tp)
            .expect_err("bias");
        assert!(err.to_string().contains("the bias must be [4]"), "{err}");
    });
}

#[test]
fn layers_describe_their_shards_so_a_refit_plan_rebuilds_the_full_weights() {
    use hypercomm_refit::{
        Peer, Place, PlanOptions, RefitPlan, Sharding, Side, Split, parse_layout,
    };

    let (w1, b1) = (pattern(15, &[8, 5]), pattern(16, &[8]));
    let (w2, b2) = (pattern(17, &[3, 8]), pattern(18, &[3]));
    let bytes =
        |t: &Tensor| -> Vec<u8> { values(t).iter().flat_map(|v| v.to_le_bytes()).collect() };
    let full = [&w1, &b1, &w2, &b2].map(bytes);
    // Each rank of tp 2: its description of the block, and the bytes of its shards.
    let ranks = run_ranks(2, 2, move |_, pgc| {
        let tp = TensorGroup::kind(&pgc, "tp").expect("tp");
        let weights = MlpWeights {
            fc1_weight: &w1,
            fc1_bias: Some(&b1),
            fc2_weight: &w2,
            fc2_bias: Some(&b2),
        };
        let mlp = ParallelMlp::from_full(weights, Activation::Silu, tp).expect("mlp");
        let params = mlp
            .param_shardings("mlp", Place::Layer(0))
            .expect("sharding");
        let shards: Vec<Vec<u8>> = mlp.vars().iter().map(|v| bytes(v.as_tensor())).collect();
        (params, shards)
    });
    let params = ranks[0].0.clone();
    assert_eq!(
        ranks[1].0, params,
        "every rank describes the same full tensors"
    );
    let described: Vec<(&str, &[u64], Split)> = params
        .iter()
        .map(|p| (p.name.as_str(), p.shape.as_slice(), p.split))
        .collect();
    assert_eq!(
        described,
        [
            ("mlp.fc1.weight", &[8, 5][..], Split::COLUMN),
            ("mlp.fc1.bias", &[8][..], Split::COLUMN),
            ("mlp.fc2.weight", &[3, 8][..], Split::ROW),
            ("mlp.fc2.bias", &[3][..], Split::Replicated),
        ]
    );
    // Refit tp 2 into one rank holding whole tensors, by running the plan's copies on the shards' bytes.
    let sharding = Sharding {
        layers: 1,
        experts: 0,
        params,
    };
    let (source, destination) = (
        parse_layout("tp=2").expect("tp 2"),
        parse_layout("dp=1").expect("one rank"),
    );
    let plan = RefitPlan::build(
        Side::new(&source, &sharding),
        Side::new(&destination, &sharding),
        PlanOptions::default(),
    )
    .expect("plan");
    let mut rebuilt: Vec<Vec<u8>> = full.iter().map(|f| vec![0; f.len()]).collect();
    for t in plan.transfers() {
        let Peer::Source(rank) = t.from else {
            panic!("one destination rank forwards nothing")
        };
        let shard = &ranks[rank].1[t.param];
        for (src, dst, len) in t.runs.iter() {
            let (src, dst, len) = (src as usize, dst as usize, len as usize);
            rebuilt[t.param][dst..dst + len].copy_from_slice(&shard[src..src + len]);
        }
    }
    assert_eq!(rebuilt, full);
    assert_eq!(
        plan.moved_bytes(),
        full.iter().map(|f| f.len() as u64).sum::<u64>()
    );
}
