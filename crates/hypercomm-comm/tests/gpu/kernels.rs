//! The kernels (pack/unpack for strided views, fill/verify): compiled with NVRTC, and run on the GPU. The fake
//! GPU has no NVRTC or PTX loader, so `the_gpu_tests_pass_under_the_fake_gpu` leaves these out.

use hypercomm_comm::device::StridedLayout;
use hypercomm_comm::{CommOptions, ReduceOp};

use crate::fake_support::nccl;
use crate::{gpu_or_skip, single, skip};

#[test]
fn kernels_compile_with_nvrtc_when_present() {
    // SAFETY: only tries to dlopen libnvrtc; nothing is called unless it opens.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        skip(
            "nvrtc",
            "libnvrtc not found (put libnvrtc.so.13's folder on LD_LIBRARY_PATH)",
        );
        return;
    }
    for source in hypercomm_kernels::ALL {
        let opts = cudarc::nvrtc::CompileOptions {
            options: vec!["--gpu-architecture=compute_90".into()],
            name: Some(source.name.into()),
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source.text, opts)
            .unwrap_or_else(|e| panic!("{} does not compile: {e:?}", source.name));
        let text = ptx.to_src();
        for k in source.kernels {
            assert!(
                text.contains(&format!(".entry {k}(")),
                "{} lacks {k}",
                source.name
            );
        }
    }
}

#[test]
fn strided_views_and_fill_verify_kernels() {
    let Some(gpu) = gpu_or_skip("kernels") else {
        return;
    };
    let comm = single(&gpu, "strided", CommOptions::named("x"));
    let mut buf = gpu.alloc_zeros::<i32>(4000).unwrap();
    let device = nccl(&comm);
    device.fill_pattern(&mut buf, 1, 3).unwrap();
    assert_eq!(device.verify_pattern(&buf, 1, 3).unwrap(), (0, None));
    let (bad, first) = device.verify_pattern(&buf, 1, 4).unwrap();
    assert_eq!((bad, first), (4000, Some(0)));
    // Columns 1..4 of a 100 x 40 matrix: reduced through staging, written back into the view only.
    let host: Vec<f32> = (0..4000).map(|i| i as f32).collect();
    let view = StridedLayout::new(1, 100, 3, 40).unwrap();
    let dev = gpu.upload(&host).unwrap();
    let dev = device
        .all_reduce_strided(dev, view, ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        dev.download().unwrap(),
        host,
        "single rank: the view is unchanged, nothing else touched"
    );
}
