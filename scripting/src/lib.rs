//! Scripts in rhai, sandboxed and deterministic (DESIGN §8): the sim's [`ScriptHost`].
//!
//! For creators (see `scenarios/scripts/` for examples):
//!
//! ```rhai
//! // A door: opens on touch. `this` is the script's state, kept between events.
//! fn on_init() { this.opens = 0; }
//! fn on_touch(who) {
//!     this.opens += 1;
//!     set_color(0xff0000ff);
//!     say(0, `the door opens (${this.opens})`);
//! }
//! ```
//!
//! - **Handlers**: `on_init()`, `on_tick()`, `on_touch(who)`, `on_chat(channel, who, text)`,
//!   `on_message(from, data)`, `on_collision(other)`, `on_timer()`. Top-level statements do
//!   not run: set things up in `on_init`.
//! - **State**: `this` is a map kept between events (in world state, snapshots and the state
//!   root). Plain values only: integers, decimals, strings, booleans, arrays, maps.
//! - **Numbers**: integers, and decimals written naturally (`1.5`), which are exact base-10
//!   fixed point (never floats). Positions and speeds convert to the sim's `Fx` (rounded to
//!   the nearest 1/65536). `sqrt`, `sin`, `cos`, `atan2` are the sim's deterministic ones.
//! - **API**: `me()`, `nearby(radius)`, `get_object(id)`, `script_source(id)`, `tick()`,
//!   `set_color(rgba)`, `set_text(s)`, `set_velocity(x, y)`, `set_target(x, y, speed)`,
//!   `apply_impulse(x, y)`, `say/whisper/shout(channel, text)`, `listen(ch)`,
//!   `unlisten(ch)`, `send(id, data)`, `start_timer(ticks)`, `stop_timer()`, `random(n)`.
//!   Nothing else: no I/O, no clock, no OS randomness, no `eval`, no `import`.
//! - **Sandbox**: a budget of rhai operations per event, the same on every node; limits on
//!   call depth, expression depth, string, array and map sizes, source and state size. A
//!   failing script reports to its owner's debug channel; the tick goes on.
//!
//! Determinism: rhai is pinned (`=1.27.0`), built with `no_float`, `decimal`, `no_time`,
//! `no_module`, `only_i64`, `sync` and without `ahash/runtime-rng`; its hashing seed is fixed
//! before any engine exists; the optimisation level is fixed; and parallel runs of different
//! objects share nothing mutable but the compiled-AST cache.

#![forbid(unsafe_code)]

mod api;
pub mod numbers;
pub mod persist;

use std::cell::RefCell;
#[allow(clippy::disallowed_types)] // a cache, looked up by key and never iterated
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};

use metatopia_sim::ScriptId;
use metatopia_sim::host::{Compiled, ScriptCtx, ScriptError, ScriptErrorKind, ScriptHost, ScriptInput, ScriptOutput};
use metatopia_sim::ids::DigestHasher;
use metatopia_sim::state::{Limits, ScriptSource};
use rhai::packages::{
    ArithmeticPackage, BasicArrayPackage, BasicIteratorPackage, BasicMapPackage, BasicStringPackage, LogicPackage,
    MoreStringPackage, Package,
};
use rhai::{AST, CallFnOptions, Dynamic, Engine, EvalAltResult, OptimizationLevel, Scope};

/// The fixed hashing seed for rhai (closure names and function hashes depend on it).
pub const RHAI_HASHING_SEED: [u64; 4] = [0x6d65_7461, 0x746f_7069, 0x6120_7268, 0x6169_2121];

/// Fix rhai's hashing seed. Must run before any rhai engine exists in the process;
/// [`RhaiHost::new`] calls it. Errors if something set a different seed first.
pub fn init_hashing() -> Result<(), String> {
    match rhai::config::hashing::set_hashing_seed(Some(RHAI_HASHING_SEED)) {
        Ok(()) => Ok(()),
        Err(Some(s)) if s == RHAI_HASHING_SEED => Ok(()),
        Err(other) => {
            Err(format!("rhai's hashing seed was already set to {other:?}; scripts would not be deterministic"))
        }
    }
}

/// Sandbox limits. Part of consensus: every node of a sim must use the same values.
#[derive(Clone, Debug)]
pub struct SandboxLimits {
    /// rhai operations per event handler call.
    pub operations_per_event: u64,
    pub call_depth: usize,
    pub expr_depth: usize,
    pub fn_expr_depth: usize,
    pub string_bytes: usize,
    pub array_len: usize,
    pub map_len: usize,
    /// Objects `nearby` returns at most.
    pub nearby_max: usize,
}

impl Default for SandboxLimits {
    fn default() -> SandboxLimits {
        SandboxLimits {
            operations_per_event: 20_000,
            call_depth: 24,
            expr_depth: 64,
            fn_expr_depth: 32,
            // rhai counts a value's strings and map entries together with everything nested in
            // it: sized so that `nearby`'s 64 objects (12 entries and up to ~400 bytes of text
            // each) fit, with room to spare (they failed past ~21 objects at 256 and 4 KiB).
            string_bytes: 32 * 1_024,
            array_len: 1_024,
            map_len: 1_024,
            nearby_max: 64,
        }
    }
}

/// Functions a script may try to use that the sandbox deliberately does not offer.
const FORBIDDEN: &[&str] = &[
    "to_float",
    "parse_float",
    "float",
    "timestamp",
    "elapsed",
    "sleep",
    "eval",
    "import",
    "print_to",
    "open",
    "read",
    "write",
    "exit",
];

#[derive(Debug)]
struct CompiledScript {
    ast: AST,
    /// Which handlers exist, by `handler()` index (looked up once, at compile time).
    has: [bool; HANDLERS.len()],
}

/// The handlers, with their arities.
const HANDLERS: [(&str, usize); 7] = [
    ("on_init", 0),
    ("on_tick", 0),
    ("on_timer", 0),
    ("on_touch", 1),
    ("on_chat", 3),
    ("on_message", 2),
    ("on_collision", 1),
];

/// The rhai script host.
#[derive(Debug)]
pub struct RhaiHost {
    engine: Engine,
    limits: SandboxLimits,
    /// Compiled ASTs by content hash; clones of a host share it (it is only a cache).
    cache: Arc<Mutex<BTreeMap<ScriptId, Arc<CompiledScript>>>>,
    /// Names `cache` for the worker threads' copies (unique in the process; an address could
    /// be reused by a later host with other limits).
    cache_id: u64,
}

impl Default for RhaiHost {
    fn default() -> RhaiHost {
        RhaiHost::new(SandboxLimits::default()).expect("rhai hashing seed")
    }
}

impl Clone for RhaiHost {
    fn clone(&self) -> RhaiHost {
        let mut host = RhaiHost::new(self.limits.clone()).expect("the seed was set by the first host");
        host.cache = self.cache.clone();
        host.cache_id = self.cache_id;
        host
    }
}

impl RhaiHost {
    /// A host with these limits (fixes rhai's hashing seed first; see [`init_hashing`]).
    pub fn new(limits: SandboxLimits) -> Result<RhaiHost, String> {
        init_hashing()?;
        let mut engine = Engine::new_raw();
        for p in [
            ArithmeticPackage::new().as_shared_module(),
            LogicPackage::new().as_shared_module(),
            BasicStringPackage::new().as_shared_module(),
            MoreStringPackage::new().as_shared_module(),
            BasicArrayPackage::new().as_shared_module(),
            BasicMapPackage::new().as_shared_module(),
            BasicIteratorPackage::new().as_shared_module(),
        ] {
            engine.register_global_module(p);
        }
        engine
            .set_optimization_level(OptimizationLevel::Simple)
            .set_max_operations(limits.operations_per_event)
            .set_max_call_levels(limits.call_depth)
            .set_max_expr_depths(limits.expr_depth, limits.fn_expr_depth)
            .set_max_string_size(limits.string_bytes)
            .set_max_array_size(limits.array_len)
            .set_max_map_size(limits.map_len)
            .set_max_variables(256)
            .set_max_functions(64)
            .set_fail_on_invalid_map_property(false);
        // The operations of the call in progress, for the per-object budget (rhai counts them
        // the same on every machine; the count restarts with each call).
        engine.on_progress(|ops| {
            OPS.set(ops);
            if ops > CAP.get() { Some(Dynamic::from(BUDGET_SPENT)) } else { None }
        });
        engine.disable_symbol("eval");
        engine.on_print(|_| {});
        engine.on_debug(|_, _, _| {});
        api::register(&mut engine);
        static NEXT_CACHE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let cache_id = NEXT_CACHE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(RhaiHost { engine, limits, cache: Arc::default(), cache_id })
    }

    fn compile_source(&self, source: &ScriptSource, limits: &Limits) -> Result<Arc<CompiledScript>, String> {
        self.compile_with_id(source.id(), source, limits)
    }

    /// `id` is the source's content hash (the instance already carries it: no need to rehash).
    fn compile_with_id(
        &self,
        id: ScriptId,
        source: &ScriptSource,
        limits: &Limits,
    ) -> Result<Arc<CompiledScript>, String> {
        if let Some(c) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&id) {
            return Ok(c.clone());
        }
        if source.source.len() > limits.max_source_bytes as usize {
            return Err(format!("source is {} bytes, the limit is {}", source.source.len(), limits.max_source_bytes));
        }
        let ast = self.engine.compile(&source.source).map_err(|e| e.to_string())?;
        let defined: BTreeSet<(String, usize)> =
            ast.iter_functions().map(|f| (f.name.to_string(), f.params.len())).collect();
        let has = HANDLERS.map(|(name, arity)| defined.contains(&(name.to_string(), arity)));
        if !has.iter().any(|h| *h) {
            return Err(
                "the script has no handler (on_init, on_tick, on_touch, on_chat, on_message, on_collision, on_timer)"
                    .into(),
            );
        }
        let compiled = Arc::new(CompiledScript { ast, has });
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= 8_192 {
            cache.clear();
        }
        cache.insert(id, compiled.clone());
        Ok(compiled)
    }

    /// Call a rhai function directly, with no sim around it (the raw baseline of the benches).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// What each worker thread keeps between handler calls: only to save allocations and locks.
/// The scope is empty before and after every call; the compiled script is content-addressed
/// (by the host's cache and the script's hash), so neither can change a result.
#[derive(Default)]
struct Local {
    scope: Scope<'static>,
    /// Which host's cache `compiled` copies (`RhaiHost::cache_id`; hosts with different limits
    /// compile differently).
    cache: u64,
    #[allow(clippy::disallowed_types)] // looked up by key, never iterated
    compiled: HashMap<ScriptId, Arc<CompiledScript>, BuildHasherDefault<DigestHasher>>,
    /// `this` for the next call: a plain map, empty between calls (`()` until first used), so a
    /// script that keeps no state costs no allocation for it.
    this: Dynamic,
}

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::new(Local::default());
    /// The operations of the handler call in progress on this thread (see `on_progress`).
    static OPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The operations the call in progress may reach before it is cut short: what is left of
    /// its object's budget for the tick, when that is less than a handler's own limit.
    static CAP: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
}

/// The token a handler cut short by its object's budget ends with.
const BUDGET_SPENT: &str = "the object's operation budget for the tick is spent";

/// Whether `this` is a map of its own (not replaced by another value, not shared).
fn plain_map(this: &Dynamic) -> bool {
    this.is_map() && !this.is_shared()
}

/// A run that did not start: the state is kept, the error reported.
fn failed(ctx: &ScriptCtx<'_>, kind: ScriptErrorKind, message: String) -> ScriptOutput {
    ScriptOutput {
        state: ctx.instance.state.clone(),
        actions: Vec::new(),
        error: Some(ScriptError { kind, message }),
        dropped: 0,
        operations: 0,
    }
}

/// The handler an input calls (an index into `HANDLERS`).
fn handler_index(input: &ScriptInput) -> usize {
    match input {
        ScriptInput::Init => 0,
        ScriptInput::Tick => 1,
        ScriptInput::Timer => 2,
        ScriptInput::Touch { .. } => 3,
        ScriptInput::Chat { .. } => 4,
        ScriptInput::Message { .. } => 5,
        ScriptInput::Collision { .. } => 6,
    }
}

fn handler_args(input: &ScriptInput) -> Vec<Dynamic> {
    match input {
        ScriptInput::Init | ScriptInput::Tick | ScriptInput::Timer => Vec::new(),
        ScriptInput::Touch { who } => vec![who.to_string().into()],
        ScriptInput::Chat { channel, speaker, text } => {
            vec![i64::from(*channel).into(), speaker.clone().into(), text.clone().into()]
        }
        ScriptInput::Message { from, data } => vec![from.to_string().into(), data.clone().into()],
        ScriptInput::Collision { other } => vec![other.to_string().into()],
    }
}

/// Map a rhai error to the kind the owner sees.
/// Whether a call ended because its object's budget for the tick was spent (not a failure).
fn cut_by_budget(e: &EvalAltResult) -> bool {
    match e {
        EvalAltResult::ErrorInFunctionCall(_, _, inner, _) | EvalAltResult::ErrorInModule(_, inner, _) => {
            cut_by_budget(inner)
        }
        EvalAltResult::ErrorTerminated(token, _) => token.clone().into_string().is_ok_and(|t| t == BUDGET_SPENT),
        _ => false,
    }
}

fn script_error(e: &EvalAltResult) -> ScriptError {
    use EvalAltResult as E;
    let kind = match e {
        E::ErrorInFunctionCall(_, _, inner, _) | E::ErrorInModule(_, inner, _) => return script_error(inner),
        E::ErrorTooManyOperations(_) => ScriptErrorKind::OutOfBudget,
        E::ErrorStackOverflow(_) => ScriptErrorKind::TooDeep,
        E::ErrorDataTooLarge(..) | E::ErrorTooManyVariables(_) => ScriptErrorKind::TooLarge,
        E::ErrorFunctionNotFound(sig, _) if FORBIDDEN.iter().any(|f| sig.starts_with(f)) => ScriptErrorKind::Forbidden,
        E::ErrorParsing(..) => ScriptErrorKind::TooDeep,
        _ => ScriptErrorKind::Runtime,
    };
    let mut message = e.to_string();
    message.truncate(400);
    ScriptError { kind, message }
}

impl ScriptHost for RhaiHost {
    fn compile(&self, source: &ScriptSource, limits: &Limits) -> Result<Compiled, String> {
        let c = self.compile_source(source, limits)?;
        Ok(Compiled { wants_tick: c.has[1] })
    }

    fn run(&self, ctx: &ScriptCtx<'_>, inputs: &[ScriptInput]) -> ScriptOutput {
        LOCAL.with_borrow_mut(|local| {
            // The compiled script: from this thread's copy of the cache if it is there, else
            // from the shared cache (a lock).
            if local.cache != self.cache_id || local.compiled.len() >= 1_024 {
                local.cache = self.cache_id;
                local.compiled.clear();
            }
            let Local { scope, compiled, this, .. } = local;
            let compiled = match compiled.entry(ctx.instance.script) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => match self.compile_with_id(ctx.instance.script, ctx.source, ctx.limits) {
                    Ok(c) => e.insert(c),
                    Err(m) => return failed(ctx, ScriptErrorKind::Runtime, m),
                },
            };
            self.run_compiled(ctx, inputs, compiled, scope, this)
        })
    }
}

impl RhaiHost {
    fn run_compiled(
        &self,
        ctx: &ScriptCtx<'_>,
        inputs: &[ScriptInput],
        compiled: &CompiledScript,
        scope: &mut Scope<'static>,
        this: &mut Dynamic,
    ) -> ScriptOutput {
        let max_state = ctx.limits.max_script_state_bytes as usize;
        let state = match persist::decode(&ctx.instance.state, max_state) {
            Ok(m) => m,
            Err(m) => return failed(ctx, ScriptErrorKind::Runtime, m),
        };
        // The worker's map is reused only while it is a plain, unshared map (a script may
        // have replaced `this`, or shared it with a closure); it is empty here.
        if !plain_map(this) {
            *this = Dynamic::from_map(state);
        } else if !state.is_empty() {
            *this.as_map_mut().expect("a plain map") = state;
        }
        let call = RefCell::new(api::Call {
            tick: ctx.tick,
            tick_seed: ctx.tick_seed,
            rng: None,
            actions: Vec::new(),
            max_nearby: self.limits.nearby_max,
        });
        let mut error = None;
        let (mut spent, mut dropped) = (0u64, 0u32);
        // The object's budget for the tick (`Limits::operations_per_object_tick`, shared with
        // its owner's other busy objects): five prims each sending 64 messages a tick to one
        // busy object no longer cost every node 180 ms a tick.
        let budget = ctx.operations;
        api::WORLD.set(ctx.world, || {
            api::NEAR.set(ctx.near, || {
                api::OBJECT.set(ctx.object, || {
                    api::CALL.set(&call, || {
                        for input in inputs {
                            let h = handler_index(input);
                            if !compiled.has[h] {
                                continue;
                            }
                            if spent >= budget {
                                dropped += 1;
                                continue;
                            }
                            // A handler that could go past what is left of the budget runs with a
                            // cap there; if it reaches it, it is undone (its actions, the state and
                            // the random stream as they were) and counts as not run, so the object
                            // never uses more than its budget, and its owner's objects together
                            // never more than the owner's.
                            let left = budget - spent;
                            let capped = left < self.limits.operations_per_event;
                            let saved = capped.then(|| {
                                let c = call.borrow();
                                (this.clone(), c.actions.len(), c.rng.clone())
                            });
                            CAP.set(if capped { left } else { u64::MAX });
                            let opts =
                                CallFnOptions::new().eval_ast(false).rewind_scope(true).bind_this_ptr(&mut *this);
                            let name = HANDLERS[h].0;
                            OPS.set(0);
                            let result = self.engine.call_fn_with_options::<Dynamic>(
                                opts,
                                scope,
                                &compiled.ast,
                                name,
                                handler_args(input),
                            );
                            CAP.set(u64::MAX);
                            spent = spent.saturating_add(OPS.get().min(left));
                            match (result, saved) {
                                (Ok(_), _) => {}
                                (Err(e), Some((before, len, rng))) if cut_by_budget(&e) => {
                                    *this = before;
                                    let mut c = call.borrow_mut();
                                    c.actions.truncate(len);
                                    c.rng = rng;
                                    dropped += 1;
                                    spent = budget;
                                }
                                (Err(e), _) => {
                                    error = Some(script_error(&e));
                                    break;
                                }
                            }
                        }
                    })
                })
            })
        });
        // Rewound after each call; cleared in case a failed call left something behind.
        scope.clear();
        // All or nothing: a failing handler's partial actions (and its tick's) are dropped with
        // its partial state below, so an error never leaves half an effect in the world.
        let actions = if error.is_some() { Vec::new() } else { call.into_inner().actions };
        let encoded = this.as_map_ref().ok().map(|m| persist::encode(&m));
        // Empty for the next call (or dropped, if no longer a plain map).
        if !plain_map(this) {
            *this = Dynamic::UNIT;
        } else {
            this.as_map_mut().expect("a plain map").clear();
        }
        let state = match encoded {
            _ if error.is_some() => ctx.instance.state.clone(),
            Some(Ok(bytes)) => bytes,
            Some(Err(m)) => {
                error.get_or_insert(ScriptError { kind: ScriptErrorKind::Runtime, message: m });
                ctx.instance.state.clone()
            }
            None => {
                error.get_or_insert(ScriptError {
                    kind: ScriptErrorKind::Runtime,
                    message: "`this` must stay a map (the script's state)".into(),
                });
                ctx.instance.state.clone()
            }
        };
        ScriptOutput { state, actions, error, dropped, operations: spent }
    }
}
