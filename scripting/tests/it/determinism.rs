//! 10,000 scripted objects: the same state root with 1 and 8 worker threads, in debug and in
//! release, pinned as golden roots at ticks 100 and 300. The test command runs both builds: 100
//! ticks with 8 workers in the debug build (300 took over two minutes there unoptimised), 300
//! ticks with 1 and with 8 workers optimised.

use metatopia_scripting::RhaiHost;
use metatopia_sim::genesis::{DemoSpec, EventGen, attach_script, demo_world};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::state::ObjectKind;
use metatopia_sim::{ObjectId, Sim, VerifiedBatch};

const WANDERER: &str = r#"
fn on_init() { this.n = 0; this.seen = 0; }
fn on_tick() {
    this.n += 1;
    if this.n % 30 == 0 { set_text(`${this.n / 30}s`); }
    if random(200) == 0 { apply_impulse(random(3) - 1, (random(5) - 2) * 0.5); }
}
fn on_touch(who) { this.seen += 1; say(0, `touched ${this.seen}`); }
fn on_message(from, data) { this.last = data; }
"#;

const GOLDEN_ROOT_100: &str = "d473a36d360a8df6a2e7ad716d315879c9038ab16c6d0a38ca67adba1a2f6001";
const GOLDEN_ROOT_300: &str = "75c2bff4fd494287ac84172d6bcf7bd9e1d87bc4b9304ecbe8b89bd9eec086dd";

/// The roots after 100 ticks and, if `ticks` is 300, after 300.
fn run(workers: u32, ticks: u64) -> (String, Option<String>) {
    let mut demo = demo_world(DemoSpec {
        seed: 77,
        objects: 10_000,
        players: 100,
        scripted_per_mille: 0,
        moving_per_mille: 20,
        ..DemoSpec::default()
    });
    let host = RhaiHost::default();
    let prims: Vec<(ObjectId, metatopia_sim::AccountId)> =
        demo.world.objects().values().filter(|o| o.kind == ObjectKind::Prim).map(|o| (o.id, o.owner)).collect();
    for (id, owner) in prims {
        attach_script(&mut demo.world, &host, id, owner, WANDERER, "AGPL-3.0-or-later").unwrap();
    }
    assert_eq!(demo.world.scripts().len(), 10_000);
    let mut sim = Sim::new(demo.world.clone(), host, KinematicPhysics::default(), workers).unwrap();
    let mut events = EventGen::new(&demo, 77);
    let mut errors = 0;
    let mut at_100 = String::new();
    for i in 1..=ticks {
        let t = sim.world().tick();
        let b = events.batch(sim.world(), t, 20);
        let r = sim.step(&VerifiedBatch::new(b, workers)).unwrap();
        errors += r.script_errors.len();
        if i == 100 {
            at_100 = sim.root().to_string();
        }
    }
    assert_eq!(errors, 0, "the wanderer never fails");
    (at_100, (ticks == 300).then(|| sim.root().to_string()))
}

#[test]
fn ten_thousand_scripts_same_root_with_1_and_8_workers() {
    let moved = "the golden root moved: determinism broke, or the state format changed";
    // At opt-level 0, 300 ticks of this world took over two minutes: the test command's debug pass
    // checks the debug build against the pin at tick 100; its optimised pass runs 300 ticks with
    // 8 workers and with 1. Together: debug with 8 workers = the pins = release with 1 = with 8.
    if cfg!(debug_assertions) {
        let (at_100, _) = run(8, 100);
        assert_eq!(at_100, GOLDEN_ROOT_100, "{moved}");
        return;
    }
    let eight = run(8, 300);
    assert_eq!(eight.0, GOLDEN_ROOT_100, "{moved}");
    assert_eq!(eight.1.as_deref(), Some(GOLDEN_ROOT_300), "{moved}");
    let one = run(1, 300);
    assert_eq!(one, eight, "worker count changed the result");
}
