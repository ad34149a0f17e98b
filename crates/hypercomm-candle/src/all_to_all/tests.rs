use candle_core::{DType, Device, Tensor, Var};

use crate::testing::{f8_bits, f8_sample, on_world, run_ranks, values};
use crate::{Error, TensorGroup};

/// Rows rank `src` sends rank `dst`: 0, 1 or 2, so some pairs exchange nothing.
fn split(src: usize, dst: usize) -> usize {
    (src + 2 * dst) % 3
}

/// Element `c` of the `k`-th row rank `src` sends rank `dst`.
fn element(src: usize, dst: usize, k: usize, c: usize) -> f64 {
    (1000 * src + 100 * dst + 10 * k + c) as f64
}

/// The rows `src` sends `dst`, each of `cols` elements, row-major.
fn rows(src: usize, dst: usize, cols: usize) -> Vec<f64> {
    (0..split(src, dst))
        .flat_map(|k| (0..cols).map(move |c| element(src, dst, k, c)))
        .collect()
}

/// This rank's input (rows for rank 0, then rank 1, ..), shaped `[rows, 2, 3]`, and its send and receive splits.
fn input(rank: usize, dtype: DType) -> (Tensor, Vec<usize>, Vec<usize>) {
    let send: Vec<usize> = (0..4).map(|d| split(rank, d)).collect();
    let recv: Vec<usize> = (0..4).map(|s| split(s, rank)).collect();
    let flat: Vec<f64> = (0..4).flat_map(|d| rows(rank, d, 6)).collect();
    let t = Tensor::from_vec(flat, (send.iter().sum::<usize>(), 2, 3), &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .expect("input");
    (t, send, recv)
}

#[test]
fn rows_go_by_split_sizes_zeros_included() {
    on_world(|rank, world| {
        for dtype in [DType::F32, DType::F64, DType::I64, DType::U32] {
            let (t, send, recv) = input(rank, dtype);
            let got = world.all_to_all_v(&t, &send, &recv).expect("all_to_all_v");
            assert_eq!(got.dims(), [recv.iter().sum::<usize>(), 2, 3], "{dtype:?}");
            assert_eq!(got.dtype(), dtype);
            let want: Vec<f64> = (0..4).flat_map(|s| rows(s, rank, 6)).collect();
            assert_eq!(values(&got), want, "{dtype:?}");
        }
        // Nothing at all to send or receive.
        let empty = Tensor::zeros((0, 5), DType::F32, &Device::Cpu).expect("empty");
        let got = world
            .all_to_all_v(&empty, &[0; 4], &[0; 4])
            .expect("empty all_to_all_v");
        assert_eq!(got.dims(), [0, 5]);
    });
}

#[test]
fn a_transposed_input_goes_by_its_logical_rows() {
    on_world(|rank, world| {
        let (t, send, recv) = input(rank, DType::F32);
        let rows_total = t.dim(0).expect("rows");
        // The same rows, as the transpose of a [6, rows] tensor.
        let view = t
            .reshape((rows_total, 6))
            .and_then(|t| t.t()?.contiguous()?.t())
            .expect("view");
        assert!(!view.is_contiguous());
        let got = world
            .all_to_all_v(&view, &send, &recv)
            .expect("all_to_all_v");
        let want: Vec<f64> = (0..4).flat_map(|s| rows(s, rank, 6)).collect();
        assert_eq!(values(&got), want);
    });
}

#[test]
fn the_gradient_flows_back_through_the_reverse_all_to_all() {
    on_world(|rank, world| {
        let (t, send, recv) = input(rank, DType::F32);
        let x = Var::from_tensor(&t).expect("var");
        let y = world
            .all_to_all_v(x.as_tensor(), &send, &recv)
            .expect("forward");
        // loss = sum(y * (2 y + 1)) with the weight held constant: dloss/dy = 2 y + 1 at each received row, which
        // the backward sends back to the row's sender, so there dloss/dx = 2 x + 1.
        let weight = y.detach().affine(2.0, 1.0).expect("weight");
        let loss = y.mul(&weight).and_then(|l| l.sum_all()).expect("loss");
        let grads = loss.backward().expect("backward");
        let gx = grads.get(x.as_tensor()).expect("gradient of x");
        assert_eq!(gx.dims(), t.dims());
        let want = t.affine(2.0, 1.0).expect("2x + 1");
        assert_eq!(values(gx), values(&want));
    });
}

#[test]
fn a_one_rank_group_returns_its_input() {
    run_ranks(1, 1, |_, pgc| {
        let tp = TensorGroup::kind(&pgc, "tp").expect("tp");
        let t = Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu).expect("t");
        let got = tp.all_to_all_v(&t, &[2], &[2]).expect("all_to_all_v");
        assert_eq!(values(&got), [1.0, 2.0, 3.0, 4.0]);
    });
}

#[test]
fn wrong_splits_are_refused_with_the_values() {
    on_world(|_, world| {
        let name = world.name().to_owned();
        let t = Tensor::zeros((5, 2), DType::F32, &Device::Cpu).expect("t");
        let err = world
            .all_to_all_v(&t, &[1, 2, 2], &[1; 4])
            .expect_err("3 splits for 4 ranks");
        assert!(
            matches!(
                err,
                Error::Argument {
                    op: "all_to_all_v",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "all_to_all_v on group {name}: send_splits [1, 2, 2] has 3 entries, but the group has 4 ranks \
                 (one entry per rank)"
            )
        );
        let err = world
            .all_to_all_v(&t, &[1, 2, 2, 0], &[1; 5])
            .expect_err("5 recv splits");
        assert!(
            err.to_string()
                .contains("recv_splits [1, 1, 1, 1, 1] has 5 entries"),
            "{err}"
        );
        let err = world
            .all_to_all_v(&t, &[1; 4], &[1; 4])
            .expect_err("4 rows of 5");
        assert!(
            err.to_string().ends_with(
                "send_splits [1, 1, 1, 1] sum to 4 rows, but the tensor has 5 (shape [5, 2])"
            ),
            "{err}"
        );
        let scalar = Tensor::new(1f32, &Device::Cpu).expect("scalar");
        let err = world
            .all_to_all_v(&scalar, &[0; 4], &[0; 4])
            .expect_err("a scalar");
        assert!(err.to_string().contains("a scalar has no dim 0"), "{err}");
        let i16 = Tensor::zeros(4, DType::I16, &Device::Cpu).expect("i16");
        let err = world.all_to_all_v(&i16, &[1; 4], &[1; 4]).expect_err("i16");
        assert!(
            matches!(
                err,
                Error::UnsupportedDType {
                    dtype: DType::I16,
                    ..
                }
            ),
            "{err:?}"
        );
    });
}

#[test]
fn splits_the_peers_disagree_on_fail_every_rank_and_leave_the_group_usable() {
    on_world(|rank, world| {
        // Rank 0 expects 2 rows from rank 1, which sends it 1.
        let t = Tensor::ones((4, 3), DType::F32, &Device::Cpu).expect("t");
        let recv = if rank == 0 { [1, 2, 1, 1] } else { [1; 4] };
        let err = world
            .all_to_all_v(&t, &[1; 4], &recv)
            .expect_err("counts disagree");
        assert!(matches!(err, Error::Comm { .. }), "rank {rank}: {err:?}");
        assert!(err.to_string().contains("disagree"), "rank {rank}: {err}");
        let (t, send, recv) = input(rank, DType::F32);
        let got = world
            .all_to_all_v(&t, &send, &recv)
            .expect("after the mismatch");
        let want: Vec<f64> = (0..4).flat_map(|s| rows(s, rank, 6)).collect();
        assert_eq!(values(&got), want);
    });
}

#[test]
fn f8e4m3_rows_go_by_split_sizes_bit_for_bit() {
    // Rank `src`'s input: its rows for rank 0, then rank 1, .., 64 elements a row, so 256 and more elements hold
    // every bit pattern (NaNs and both zeros included).
    let input = |src: usize| {
        let rows: usize = (0..4).map(|d| split(src, d)).sum();
        f8_sample(src, &[rows, 64])
    };
    on_world(move |rank, world| {
        let send: Vec<usize> = (0..4).map(|d| split(rank, d)).collect();
        let recv: Vec<usize> = (0..4).map(|s| split(s, rank)).collect();
        let got = world
            .all_to_all_v(&input(rank), &send, &recv)
            .expect("all_to_all_v");
        assert_eq!(got.dtype(), DType::F8E4M3);
        assert_eq!(got.dims(), [recv.iter().sum::<usize>(), 64]);
        // From each rank `s`, the rows it put after those for the ranks before this one.
        let want: Vec<u8> = (0..4)
            .flat_map(|s| {
                let first = (0..rank).map(|d| split(s, d)).sum();
                f8_bits(&input(s).narrow(0, first, split(s, rank)).expect("narrow"))
            })
            .collect();
        assert_eq!(f8_bits(&got), want);
    });
}
