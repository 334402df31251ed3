//! Properties of hostile script outputs (proptest): whatever a creator's scripts say, send,
//! listen to, keep or burn, every collection of the world stays within its bound, no tick runs
//! more operations than its accounts' budgets, and the result does not depend on the number
//! of worker threads (so it is the same on every node).

use metatopia_scripting::RhaiHost;
use metatopia_sim::genesis::{DemoSpec, attach_script, demo_world, tick_seed, tick_time_ms};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::state::{MAX_INBOX_PER_TICK, MAX_LISTEN_CHANNELS, MAX_QUEUE, ObjectKind};
use metatopia_sim::{Batch, ObjectId, Sim, VerifiedBatch};
use proptest::prelude::*;

/// One thing a handler does.
#[derive(Clone, Debug)]
enum Op {
    Say { channel: i64, bytes: usize, times: usize },
    Listen { from: i64, count: usize },
    Unlisten { channel: i64 },
    Send { to: usize, times: usize },
    Timer { every: i64 },
    Keep { bytes: usize },
    Burn { iterations: usize },
    FailEvery { ticks: i64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0i64..3, 0usize..400, 1usize..80).prop_map(|(channel, bytes, times)| Op::Say { channel, bytes, times }),
        (0i64..200, 1usize..100).prop_map(|(from, count)| Op::Listen { from, count }),
        (0i64..200).prop_map(|channel| Op::Unlisten { channel }),
        (0usize..16, 1usize..80).prop_map(|(to, times)| Op::Send { to, times }),
        (1i64..4).prop_map(|every| Op::Timer { every }),
        (0usize..20_000).prop_map(|bytes| Op::Keep { bytes }),
        (0usize..3_000).prop_map(|iterations| Op::Burn { iterations }),
        (2i64..4).prop_map(|ticks| Op::FailEvery { ticks }),
    ]
}

/// A handler's body in rhai.
fn body(ops: &[Op], ids: &[ObjectId]) -> String {
    let mut s = String::new();
    for o in ops {
        s += &match o {
            Op::Say { channel, bytes, times } => {
                format!("for i in 0..{times} {{ let t = \"s\"; t.pad({bytes}, \"x\"); say({channel}, t); }}\n")
            }
            Op::Listen { from, count } => format!("for c in {from}..{} {{ listen(c); }}\n", from + *count as i64),
            Op::Unlisten { channel } => format!("unlisten({channel});\n"),
            Op::Send { to, times } => {
                format!("for i in 0..{times} {{ send(\"{}\", `m${{i}}`); }}\n", ids[to % ids.len()])
            }
            Op::Timer { every } => format!("start_timer({every});\n"),
            Op::Keep { bytes } => format!("let k = \"k\"; k.pad({bytes}, \"y\"); this.kept = k;\n"),
            Op::Burn { iterations } => format!("let n = 0; for i in 0..{iterations} {{ n += i; }}\n"),
            Op::FailEvery { ticks } => format!("if tick() % {ticks} == 0 {{ throw \"now\"; }}\n"),
        };
    }
    s
}

/// A script of three handlers made of ops.
fn script() -> impl Strategy<Value = [Vec<Op>; 3]> {
    [prop::collection::vec(op(), 0..5), prop::collection::vec(op(), 0..3), prop::collection::vec(op(), 0..3)]
}

/// Run the scripts on a fresh world with `workers` threads: each tick's root and cost.
fn run(scripts: &[[Vec<Op>; 3]], workers: u32, ticks: u64) -> Vec<(String, u64)> {
    let mut demo = demo_world(DemoSpec { seed: 5, objects: 16, players: 3, ..DemoSpec::default() });
    // Small budgets, so that the scripts reach them.
    let mut settings = demo.world.settings().clone();
    settings.limits.operations_per_object_tick = 5_000;
    settings.limits.operations_per_account_tick = 12_000;
    demo.world.set_genesis_settings(settings);
    let host = RhaiHost::default();
    let prims: Vec<(ObjectId, metatopia_sim::AccountId)> =
        demo.world.objects().values().filter(|o| o.kind == ObjectKind::Prim).map(|o| (o.id, o.owner)).collect();
    let ids: Vec<ObjectId> = prims.iter().map(|p| p.0).collect();
    for (i, handlers) in scripts.iter().enumerate() {
        let (id, owner) = prims[i % prims.len()];
        let src = format!(
            "fn on_tick() {{\n{}}}\nfn on_chat(ch, who, text) {{\n{}}}\nfn on_message(from, data) {{\n{}}}\n",
            body(&handlers[0], &ids),
            body(&handlers[1], &ids),
            body(&handlers[2], &ids)
        );
        attach_script(&mut demo.world, &host, id, owner, &src, "AGPL-3.0-or-later").expect("compiles");
    }
    let accounts = demo.world.accounts().len() as u64;
    let mut sim = Sim::new(demo.world, host, KinematicPhysics::default(), workers).expect("physics");
    let mut out = Vec::new();
    for _ in 0..ticks {
        let tick = sim.world().tick();
        let rate = sim.world().settings().tick_rate_hz;
        let b = Batch { tick, time_ms: tick_time_ms(tick, rate), seed: tick_seed(tick), events: Vec::new() };
        let r = sim.step(&VerifiedBatch::new(b, workers)).expect("batch for this tick");
        let w = sim.world();
        let limits = &w.settings().limits;
        assert!(
            r.script_operations <= accounts * limits.operations_per_account_tick,
            "{} operations in a tick, over {accounts} accounts' budgets",
            r.script_operations
        );
        w.validate().expect("every collection within its bound");
        assert!(w.queue().len() <= MAX_QUEUE);
        let mut inbox = std::collections::BTreeMap::new();
        for q in w.queue() {
            *inbox.entry(q.target()).or_insert(0u32) += 1;
        }
        assert!(inbox.values().all(|n| *n <= MAX_INBOX_PER_TICK), "an inbox over its bound");
        for inst in w.scripts().values() {
            assert!(inst.listen.len() <= MAX_LISTEN_CHANNELS);
            assert!(inst.state.len() <= limits.max_script_state_bytes as usize);
        }
        out.push((r.root.to_string(), r.script_operations));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn no_script_outputs_grow_a_collection_past_its_bound_and_workers_change_nothing(
        scripts in prop::collection::vec(script(), 1..12)
    ) {
        let one = run(&scripts, 1, 8);
        let three = run(&scripts, 3, 8);
        prop_assert_eq!(one, three);
    }
}
