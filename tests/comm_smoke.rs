mod comm_support;
use comm_support::*;
use hypercomm::comm::ReduceOp;

#[test]
fn smoke_all_reduce_two_ranks() {
    for tcp in [false, true] {
        let out = on_threads(2, options(&format!("smoke-{tcp}"), tcp), |comm| {
            let v = values::<f32>(ReduceOp::Sum, comm.rank(), 10);
            comm.all_reduce(v, ReduceOp::Sum).unwrap().wait().unwrap()
        });
        for o in out {
            assert_close(&o, &expected::<f32>(ReduceOp::Sum, 2, 10), "smoke");
        }
    }
}
