//! Plans worked by hand: the RL refit of the issue, strided re-splits, tied embeddings, experts, and the errors.

use crate::{
    DType, GptConfig, ParamSharding, Peer, Place, PlanOptions, RefitError, RefitPlan, Runs,
    Sharding, Side, Split, Stride, Summary, parse_layout,
};

fn plan(
    from: &str,
    to: &str,
    sharding: &Sharding,
    options: PlanOptions,
) -> Result<RefitPlan, RefitError> {
    let (source, destination) = (parse_layout(from)?, parse_layout(to)?);
    RefitPlan::build(
        Side::new(&source, sharding),
        Side::new(&destination, sharding),
        options,
    )
}

fn one(param: ParamSharding) -> Sharding {
    let mut s = Sharding::new(1, 0);
    s.push(param);
    s
}

#[test]
fn trainer_tp2_pp2_dp2_refits_two_engine_replicas_of_tp2() {
    let model = GptConfig::new(4, 256, 1024).sharding().unwrap();
    let bytes = model.bytes().unwrap();
    let replicated: u64 = model
        .params
        .iter()
        .filter(|p| p.split == Split::Replicated)
        .map(|p| p.bytes().unwrap())
        .sum();
    // Each engine rank holds half of each split tensor and every replicated one (norms, row-parallel biases).
    let per_rank = (bytes - replicated) / 2 + replicated;
    let forwarding = plan(
        "tp=2,pp=2,dp=2",
        "tp=2,dp=2",
        &model,
        PlanOptions::default(),
    )
    .unwrap();
    let s = Summary::of(&forwarding);
    assert!(
        s.destinations
            .iter()
            .all(|d| d.from_sources + d.from_replicas == per_rank)
    );
    // The trainer sends each engine shard once (the model once); the replicas forward the rest.
    assert_eq!((s.from_sources, s.forwarded), (bytes, 4 * per_rank - bytes));
    // The members of each engine class share what the trainer sends them, to within a bucket.
    let (first, second) = (&s.destinations[..2], &s.destinations[2..]);
    for (a, b) in first.iter().zip(second) {
        assert!(
            a.from_sources.abs_diff(b.from_sources) <= 2 * forwarding.options().bucket_bytes,
            "{a:?} {b:?}"
        );
    }
    // All 8 trainer ranks send, each its balanced share; stage 0 and stage 1 hold different bytes.
    assert!(
        s.sources
            .iter()
            .all(|r| r.sent > 0 && (r.sent as f64 - r.share).abs() < 16.0)
    );
    assert_eq!(
        s.sources.iter().map(|r| r.share).sum::<f64>().round() as u64,
        bytes
    );

    let direct = plan(
        "tp=2,pp=2,dp=2",
        "tp=2,dp=2",
        &model,
        PlanOptions::default().forward(false),
    )
    .unwrap();
    let d = Summary::of(&direct);
    assert_eq!((d.from_sources, d.forwarded), (4 * per_rank, 0));
    assert_eq!(d.moved, forwarding.moved_bytes());
    // Trainer tp rank t sends only to engine ranks with tp t: a column-parallel shard maps onto the same shard.
    assert!(direct.transfers().iter().all(|t| match t.from {
        Peer::Source(r) => r % 2 == t.to % 2,
        Peer::Destination(_) => false,
    }));
}

#[test]
fn row_parallel_resplit_is_one_strided_runs_per_pair_of_shards() {
    // A [4, 16] f32 row-parallel weight: trainer tp 4 (4 columns each), engine tp 2 (8 columns each).
    let s = one(ParamSharding::new(
        "fc2",
        [4, 16],
        DType::F32,
        Split::ROW,
        Place::First,
    ));
    let p = plan("tp=4", "tp=2", &s, PlanOptions::default().forward(false)).unwrap();
    let to_engine0: Vec<(Peer, Runs)> = p
        .transfers()
        .iter()
        .filter(|t| t.to == 0)
        .map(|t| (t.from, t.runs.clone()))
        .collect();
    let rows = |dst_offset| Runs {
        src_offset: 0,
        dst_offset,
        len: 16,
        repeat: vec![Stride {
            count: 4,
            src: 16,
            dst: 32,
        }],
    };
    assert_eq!(
        to_engine0,
        [(Peer::Source(0), rows(0)), (Peer::Source(1), rows(16))]
    );
    // And back: engine tp 2 into trainer tp 4 reads every other half-row.
    let back = plan("tp=2", "tp=4", &s, PlanOptions::default()).unwrap();
    let to_trainer3: Vec<(Peer, Runs)> = back
        .transfers()
        .iter()
        .filter(|t| t.to == 3)
        .map(|t| (t.from, t.runs.clone()))
        .collect();
    let expected = Runs {
        src_offset: 16,
        dst_offset: 0,
        len: 16,
        repeat: vec![Stride {
            count: 4,
            src: 32,
            dst: 16,
        }],
    };
    assert_eq!(to_trainer3, [(Peer::Source(1), expected)]);
}

#[test]
fn buckets_bound_every_rank_and_forwards_come_later() {
    let model = GptConfig::new(2, 128, 512).sharding().unwrap();
    let options = PlanOptions::default().bucket_bytes(16 << 10);
    let p = plan("tp=2,dp=4", "tp=1,dp=4", &model, options).unwrap();
    assert!(p.bucket_count() > 1);
    let mut arrived = std::collections::BTreeMap::new();
    for (b, bucket) in p.buckets().enumerate() {
        let mut sent = std::collections::BTreeMap::new();
        let mut received = std::collections::BTreeMap::new();
        for t in bucket {
            assert_eq!(t.bucket, b);
            *sent.entry(t.from).or_insert(0) += t.bytes();
            *received.entry(t.to).or_insert(0) += t.bytes();
            if let Peer::Destination(from) = t.from {
                let first: &usize = arrived
                    .get(&(from, t.param, t.runs.src_offset))
                    .expect("forwarded bytes arrived");
                assert!(*first < b);
            }
            for (_, dst, _) in t.runs.iter() {
                arrived.entry((t.to, t.param, dst)).or_insert(b);
            }
        }
        assert!(
            sent.values()
                .chain(received.values())
                .all(|&v| v <= 16 << 10)
        );
    }
    assert_eq!(
        p.transfers().len(),
        p.buckets().map(<[_]>::len).sum::<usize>()
    );
    assert!(p.bucket(p.bucket_count()).is_empty());
}

#[test]
fn tied_embeddings_reach_both_stages_and_experts_their_owner() {
    let model: GptConfig = "layers=2,hidden=64,vocab=256,tied,experts=4,moe_ffn=32"
        .parse()
        .unwrap();
    let sharding = model.sharding().unwrap();
    // Trainer: ep 4 with etp 1 over 8 ranks; engine: tp 2, pp 2, experts whole on each tp rank (ep 1).
    let p = plan(
        "tp=2,dp=4,ep=4,etp=1",
        "tp=2,pp=2",
        &sharding,
        PlanOptions::default(),
    )
    .unwrap();
    assert_eq!(p.moved_bytes(), p.needed_bytes());
    let emb = p
        .params()
        .iter()
        .position(|q| q.name == "embedding.word_embeddings.weight")
        .unwrap();
    // Engine ranks 0, 1 (stage 0) and 2, 3 (stage 1) each receive their vocab half once.
    for rank in 0..4 {
        let got: u64 = p
            .transfers()
            .iter()
            .filter(|t| t.param == emb && t.to == rank)
            .map(|t| t.bytes())
            .sum();
        assert_eq!(got, 256 * 64 * 2 / 2, "rank {rank}");
    }
    // Expert 3's weight comes only from ep rank 3 of the trainer's expert grid: ranks 3 and 7.
    let e3 = p
        .params()
        .iter()
        .position(|q| q.name == "decoder.layers.1.mlp.experts.3.linear_fc1.weight")
        .unwrap();
    let senders: std::collections::BTreeSet<Peer> = p
        .transfers()
        .iter()
        .filter(|t| t.param == e3)
        .map(|t| t.from)
        .collect();
    assert!(
        senders
            .iter()
            .all(|s| matches!(s, Peer::Source(3 | 7) | Peer::Destination(_))),
        "{senders:?}"
    );
}

#[test]
fn same_inputs_same_plan_and_json_round_trips() {
    let model: GptConfig = "layers=4,hidden=64,vocab=128,gated".parse().unwrap();
    let sharding = model.sharding().unwrap();
    let a = plan(
        "tp=4,pp=2,dp=2",
        "tp=2,dp=3",
        &sharding,
        PlanOptions::default().bucket_bytes(4096),
    )
    .unwrap();
    let b = plan(
        "tp=4,pp=2,dp=2",
        "tp=2,dp=3",
        &sharding,
        PlanOptions::default().bucket_bytes(4096),
    )
    .unwrap();
    assert_eq!(a, b);
    let json = serde_json::to_string(&a).unwrap();
    assert_eq!(serde_json::from_str::<RefitPlan>(&json).unwrap(), a);
}

#[test]
fn errors_name_the_parameter_and_the_rule() {
    let s = |shape: &[u64], dtype| {
        one(ParamSharding::new(
            "w",
            shape.to_vec(),
            dtype,
            Split::COLUMN,
            Place::First,
        ))
    };
    let (src, dst) = (parse_layout("tp=2").unwrap(), parse_layout("tp=2").unwrap());
    let build = |a: &Sharding, b: &Sharding, options| {
        RefitPlan::build(Side::new(&src, a), Side::new(&dst, b), options)
    };
    let err =
        |a: &Sharding, b: &Sharding| build(a, b, PlanOptions::default()).unwrap_err().to_string();
    assert_eq!(
        err(&s(&[4, 2], DType::F32), &s(&[8, 2], DType::F32)),
        "parameter \"w\" has shape [8, 2] on the destination but [4, 2] on the source"
    );
    assert_eq!(
        err(&s(&[4, 2], DType::F32), &s(&[4, 2], DType::Bf16)),
        "parameter \"w\" has element type bf16 on the destination but f32 on the source"
    );
    let other = one(ParamSharding::new(
        "v",
        [4],
        DType::F32,
        Split::Replicated,
        Place::First,
    ));
    assert_eq!(
        err(&s(&[4, 2], DType::F32), &other),
        "destination parameter \"v\" is not in the source sharding"
    );
    assert_eq!(
        err(&s(&[5, 2], DType::F32), &s(&[5, 2], DType::F32)),
        "parameter \"w\": dim 0 of size 5 does not split into 2 tensor-parallel shard(s) of 1 block(s) each"
    );
    let tiny = build(
        &s(&[4, 2], DType::F32),
        &s(&[4, 2], DType::F32),
        PlanOptions::default().bucket_bytes(100),
    );
    assert_eq!(
        tiny.unwrap_err().to_string(),
        "bucket of 100 bytes is below the minimum of 1024 bytes"
    );
    let staged = one(ParamSharding::new(
        "w",
        [4],
        DType::F32,
        Split::Replicated,
        Place::Stage(1),
    ));
    assert_eq!(
        build(&staged, &staged, PlanOptions::default())
            .unwrap_err()
            .to_string(),
        "parameter \"w\" is placed on stage 1, but the layout has pp 1"
    );
    let huge = parse_layout("dp=2097152").unwrap();
    let small = s(&[4, 2], DType::F32);
    assert_eq!(
        RefitPlan::build(
            Side::new(&src, &small),
            Side::new(&huge, &small),
            PlanOptions::default()
        )
        .unwrap_err()
        .to_string(),
        "the destination layout has 2097152 ranks; a plan lists every rank's transfers and takes at most 1048576"
    );
    let big = one(ParamSharding::new(
        "w",
        [1 << 30, 1 << 30],
        DType::F64,
        Split::COLUMN,
        Place::First,
    ));
    assert!(matches!(
        RefitPlan::build(
            Side::new(&src, &big),
            Side::new(&dst, &big),
            PlanOptions::default()
        ),
        Err(RefitError::TooManyBytes { ranks: 2, .. })
    ));
    // Source parameters the destination lacks are ignored.
    let mut both = s(&[4, 2], DType::F32);
    both.push(ParamSharding::new(
        "v",
        [4],
        DType::F32,
        Split::Replicated,
        Place::First,
    ));
    assert!(build(&both, &s(&[4, 2], DType::F32), PlanOptions::default()).is_ok());
}
