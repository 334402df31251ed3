//! Many independent BLAKE3 compressions side by side, in SIMD lanes.
//!
//! The state root costs thousands of BLAKE3 compressions of one or two blocks a tick: one for
//! each changed object's leaf, two for each 4-ary node on a changed path (about 6,000 when
//! 1,500 of 15,000 objects move). The `blake3` crate's SIMD works across the chunks of one long
//! input, so for these it compresses one block at a time, each waiting on the last. Within a
//! tree level they are independent, though, so here they run side by side: row `i` of the
//! state holds word `i` of every lane, each step of the compression is one vector instruction
//! over all lanes, and the blocks go in and the chaining values come out through a transpose.
//!
//! The lane set is picked at run time: 16 lanes with AVX-512 (which has a rotate), 8 with AVX2
//! (rotations by whole bytes as byte shuffles), and the `blake3` crate one hash at a time on
//! any other CPU. [`pulp`] detects the features and runs the code inside functions compiled for
//! them, so `sim` stays free of `unsafe`. The function is BLAKE3's, bit for bit, on every path:
//! integer adds, xors and rotations, nothing rounded, so the lane set changes the speed and
//! never a hash (DESIGN §5). The tests check every path this CPU has against the `blake3` crate.
//!
//! Three shapes of input are covered, the ones the Merkle trees hash:
//! - [`keyed_hash_many`]: BLAKE3 keyed hashes; the same as `blake3::keyed_hash` on each
//!   (inputs over one chunk, 1,024 bytes, are handed to the crate).
//! - [`nodes4_at`]: keyed hashes of four 32-byte children (128 bytes, two blocks); the same
//!   as `blake3::keyed_hash` of the four side by side. The state's trees are 4-ary (see
//!   [`crate::merkle`]).
//! - [`keyed_hash_blocks_at`]: keyed hashes of inputs of at most one block, given padded (the
//!   objects' leaves).

const IV: [u32; 8] = [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19];
const MSG_PERMUTATION: [usize; 16] = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8];
const CHUNK_START: u32 = 1;
const CHUNK_END: u32 = 2;
const ROOT: u32 = 8;
const KEYED_HASH: u32 = 16;
const BLOCK: usize = 64;
/// The message of a lane with nothing to hash.
static ZERO_BLOCK: [u8; BLOCK] = [0; BLOCK];
/// Inputs longer than one chunk are hashed by the `blake3` crate itself.
const MAX_INPUT: usize = 1024;

/// The message word order of each of the seven rounds.
const SCHEDULE: [[usize; 16]; 7] = {
    let mut s = [[0usize; 16]; 7];
    let mut i = 0;
    while i < 16 {
        s[0][i] = i;
        i += 1;
    }
    let mut r = 1;
    while r < 7 {
        let mut i = 0;
        while i < 16 {
            s[r][i] = s[r - 1][MSG_PERMUTATION[i]];
            i += 1;
        }
        r += 1;
    }
    s
};

/// The vector operations the compression needs, on one register of lanes ("row": word `i`
/// of every lane's state).
trait Rows: Copy {
    type Row: Copy;
    const LANES: usize;
    fn load(self, words: &[u32; 16]) -> Self::Row;
    fn store(self, row: Self::Row) -> [u32; 16];
    fn splat(self, w: u32) -> Self::Row;
    fn add(self, a: Self::Row, b: Self::Row) -> Self::Row;
    fn xor(self, a: Self::Row, b: Self::Row) -> Self::Row;
    fn ror16(self, a: Self::Row) -> Self::Row;
    fn ror12(self, a: Self::Row) -> Self::Row;
    fn ror8(self, a: Self::Row) -> Self::Row;
    fn ror7(self, a: Self::Row) -> Self::Row;

    /// Message rows from each lane's block (`blocks[l]` is lane `l`'s 16 words): a transpose.
    #[inline(always)]
    fn message(self, blocks: &[[u32; 16]; 16]) -> [Self::Row; 16] {
        let mut rows = [self.splat(0); 16];
        for (i, row) in rows.iter_mut().enumerate() {
            let mut words = [0u32; 16];
            for (l, w) in words.iter_mut().enumerate() {
                *w = blocks[l][i];
            }
            *row = self.load(&words);
        }
        rows
    }

    /// Message rows from each lane's block given as its 64 bytes.
    #[inline(always)]
    fn message_bytes(self, blocks: &[&[u8; BLOCK]; 16]) -> [Self::Row; 16] {
        let mut words = [[0u32; 16]; 16];
        for (w, b) in words.iter_mut().zip(blocks) {
            words_into(*b, w);
        }
        self.message(&words)
    }

    /// Each lane's chaining value from the rows: the transpose back.
    #[inline(always)]
    fn lanes(self, rows: &[Self::Row; 8]) -> [[u32; 8]; 16] {
        let mut out = [[0u32; 8]; 16];
        for (i, row) in rows.iter().enumerate() {
            let words = self.store(*row);
            for (l, o) in out.iter_mut().enumerate() {
                o[i] = words[l];
            }
        }
        out
    }
}

/// One compression in each lane: chaining values `cv`, message words `m` (row `i` holds word
/// `i` of every lane), per-lane block lengths and one set of flags; the counter is 0
/// (single-chunk inputs only). Returns the new chaining values, as rows.
#[inline(always)]
fn compress<R: Rows>(r: R, cv: &[R::Row; 8], m: &[R::Row; 16], block_len: R::Row, flags: u32) -> [R::Row; 8] {
    let mut v = [
        cv[0],
        cv[1],
        cv[2],
        cv[3],
        cv[4],
        cv[5],
        cv[6],
        cv[7],
        r.splat(IV[0]),
        r.splat(IV[1]),
        r.splat(IV[2]),
        r.splat(IV[3]),
        r.splat(0),
        r.splat(0),
        block_len,
        r.splat(flags),
    ];
    round(r, &mut v, m, &SCHEDULE[0]);
    round(r, &mut v, m, &SCHEDULE[1]);
    round(r, &mut v, m, &SCHEDULE[2]);
    round(r, &mut v, m, &SCHEDULE[3]);
    round(r, &mut v, m, &SCHEDULE[4]);
    round(r, &mut v, m, &SCHEDULE[5]);
    round(r, &mut v, m, &SCHEDULE[6]);
    let mut out = [v[0]; 8];
    for (i, o) in out.iter_mut().enumerate() {
        *o = r.xor(v[i], v[i + 8]);
    }
    out
}

#[inline(always)]
fn round<R: Rows>(r: R, v: &mut [R::Row; 16], m: &[R::Row; 16], s: &[usize; 16]) {
    g(r, v, [0, 4, 8, 12], m[s[0]], m[s[1]]);
    g(r, v, [1, 5, 9, 13], m[s[2]], m[s[3]]);
    g(r, v, [2, 6, 10, 14], m[s[4]], m[s[5]]);
    g(r, v, [3, 7, 11, 15], m[s[6]], m[s[7]]);
    g(r, v, [0, 5, 10, 15], m[s[8]], m[s[9]]);
    g(r, v, [1, 6, 11, 12], m[s[10]], m[s[11]]);
    g(r, v, [2, 7, 8, 13], m[s[12]], m[s[13]]);
    g(r, v, [3, 4, 9, 14], m[s[14]], m[s[15]]);
}

/// BLAKE3's mixing function on four rows.
#[inline(always)]
fn g<R: Rows>(r: R, v: &mut [R::Row; 16], [a, b, c, d]: [usize; 4], x: R::Row, y: R::Row) {
    v[a] = r.add(r.add(v[a], v[b]), x);
    v[d] = r.ror16(r.xor(v[d], v[a]));
    v[c] = r.add(v[c], v[d]);
    v[b] = r.ror12(r.xor(v[b], v[c]));
    v[a] = r.add(r.add(v[a], v[b]), y);
    v[d] = r.ror8(r.xor(v[d], v[a]));
    v[c] = r.add(v[c], v[d]);
    v[b] = r.ror7(r.xor(v[b], v[c]));
}

fn key_words(key: &[u8; 32]) -> [u32; 8] {
    std::array::from_fn(|i| u32::from_le_bytes([key[4 * i], key[4 * i + 1], key[4 * i + 2], key[4 * i + 3]]))
}

/// How many 64-byte blocks BLAKE3 compresses for a single-chunk input (at least one).
fn blocks(len: usize) -> usize {
    len.div_ceil(BLOCK).max(1)
}

/// The key's words, one per row.
///
/// (No `std::array::from_fn` with a closure anywhere on these paths: the closure becomes a
/// function of its own, compiled without the lane set's CPU features, and when the compiler
/// chose not to inline it every vector instruction in it was a call. That happened in a
/// benchmark's binary, where the binary tree's parent nodes were hashed 3.4x slower, 13.7 →
/// 47 µs for 1,300 of them.)
#[inline(always)]
fn splat_key<R: Rows>(r: R, key: &[u32; 8]) -> [R::Row; 8] {
    let mut cv = [r.splat(0); 8];
    for (c, k) in cv.iter_mut().zip(key) {
        *c = r.splat(*k);
    }
    cv
}

/// Keyed hashes of inputs of `n` blocks each (`n` ≤ 16), `R::LANES` at a time.
#[inline(always)]
fn hash_group<R: Rows>(r: R, key: &[u32; 8], inputs: &[&[u8]], group: &[u32], n: usize, out: &mut [[u8; 32]]) {
    for batch in group.chunks(R::LANES) {
        let mut cv = splat_key(r, key);
        for b in 0..n {
            let mut blocks = [[0u32; 16]; 16];
            let mut lens = [0u32; 16];
            for (l, &idx) in batch.iter().enumerate() {
                let input = inputs[idx as usize];
                let block = &input[(b * BLOCK).min(input.len())..((b + 1) * BLOCK).min(input.len())];
                lens[l] = block.len() as u32;
                if block.len() == BLOCK {
                    words_into(block, &mut blocks[l]);
                } else {
                    let mut padded = [0u8; BLOCK];
                    padded[..block.len()].copy_from_slice(block);
                    words_into(&padded, &mut blocks[l]);
                }
            }
            let m = r.message(&blocks);
            let mut flags = KEYED_HASH;
            if b == 0 {
                flags |= CHUNK_START;
            }
            if b + 1 == n {
                flags |= CHUNK_END | ROOT;
            }
            cv = compress(r, &cv, &m, r.load(&lens), flags);
        }
        let lanes = r.lanes(&cv);
        for (l, &i) in batch.iter().enumerate() {
            out[i as usize] = cv_bytes(&lanes[l]);
        }
    }
}

/// `parents[q]` = the keyed hash of `children[4q..4q + 4]` (two full blocks) for each `q` in
/// `at`, `R::LANES` at a time.
#[inline(always)]
fn node4_group<R: Rows>(r: R, key: &[u32; 8], children: &[[u8; 32]], at: &[u32], parents: &mut [[u8; 32]]) {
    let block_len = r.splat(BLOCK as u32);
    for batch in at.chunks(R::LANES) {
        let mut first = [&ZERO_BLOCK; 16];
        let mut second = [&ZERO_BLOCK; 16];
        for (l, &q) in batch.iter().enumerate() {
            let (a, b) = children[4 * q as usize..4 * q as usize + 4].split_at(2);
            first[l] = a.as_flattened().try_into().expect("two children are one block");
            second[l] = b.as_flattened().try_into().expect("two children are one block");
        }
        let cv = splat_key(r, key);
        let m = r.message_bytes(&first);
        let cv = compress(r, &cv, &m, block_len, KEYED_HASH | CHUNK_START);
        let m = r.message_bytes(&second);
        let h = compress(r, &cv, &m, block_len, KEYED_HASH | CHUNK_END | ROOT);
        let lanes = r.lanes(&h);
        for (&q, lane) in batch.iter().zip(&lanes) {
            parents[q as usize] = cv_bytes(lane);
        }
    }
}

/// Keyed hashes of one-block inputs (`blocks[i]` zero-padded past `lens[i]` ≤ 64 bytes) into
/// `out[at[i]]`, `R::LANES` at a time.
#[inline(always)]
fn block_group<R: Rows>(r: R, key: &[u32; 8], blocks: &[[u8; BLOCK]], lens: &[u8], at: &[u32], out: &mut [[u8; 32]]) {
    for ((batch, lens), at) in blocks.chunks(R::LANES).zip(lens.chunks(R::LANES)).zip(at.chunks(R::LANES)) {
        let mut rows = [&ZERO_BLOCK; 16];
        let mut len = [0u32; 16];
        for (l, block) in batch.iter().enumerate() {
            rows[l] = block;
            len[l] = u32::from(lens[l]);
        }
        let cv = splat_key(r, key);
        let m = r.message_bytes(&rows);
        let h = compress(r, &cv, &m, r.load(&len), KEYED_HASH | CHUNK_START | CHUNK_END | ROOT);
        let lanes = r.lanes(&h);
        for (&i, lane) in at.iter().zip(&lanes) {
            out[i as usize] = cv_bytes(lane);
        }
    }
}

/// Little-endian words from bytes (`bytes.len() == 4 * out.len()`).
#[inline(always)]
fn words_into(bytes: &[u8], out: &mut [u32]) {
    for (w, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// A chaining value as bytes.
#[inline(always)]
fn cv_bytes(words: &[u32; 8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// The widest lane set this CPU offers, found at run time.
#[derive(Clone, Copy, Debug)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx512(pulp::x86::V4),
    #[cfg(target_arch = "x86_64")]
    Avx2(pulp::x86::V3),
    /// No vector path: the `blake3` crate, one hash at a time.
    One,
}

impl Isa {
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(v4) = pulp::x86::V4::try_new() {
                return Isa::Avx512(v4);
            }
            if let Some(v3) = pulp::x86::V3::try_new() {
                return Isa::Avx2(v3);
            }
        }
        Isa::One
    }
}

/// `blake3::keyed_hash(key, input)` for every input.
pub fn keyed_hash_many(key: &[u8; 32], inputs: &[&[u8]]) -> Vec<[u8; 32]> {
    keyed_hash_many_on(Isa::detect(), key, inputs)
}

fn keyed_hash_many_on(isa: Isa, key: &[u8; 32], inputs: &[&[u8]]) -> Vec<[u8; 32]> {
    let mut out = vec![[0u8; 32]; inputs.len()];
    // Lanes must compress the same number of blocks, so inputs are grouped by block count
    // (usually there is one group: no sort then); inputs over one chunk go to the `blake3`
    // crate.
    let mut order: Vec<u32> = (0..inputs.len() as u32).collect();
    let first = inputs.first().map_or(0, |i| blocks(i.len()));
    if inputs.iter().any(|i| blocks(i.len()) != first) {
        order.sort_by_key(|&i| blocks(inputs[i as usize].len()));
    }
    let k = key_words(key);
    let mut rest = &order[..];
    while let Some(&first) = rest.first() {
        let n = blocks(inputs[first as usize].len());
        let same = rest.iter().take_while(|&&i| blocks(inputs[i as usize].len()) == n).count();
        let (group, tail) = rest.split_at(same);
        rest = tail;
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(s) if n * BLOCK <= MAX_INPUT => {
                pulp::Simd::vectorize(s, Hash { r: x86::R16(s), key: &k, inputs, group, n, out: &mut out })
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(s) if n * BLOCK <= MAX_INPUT => {
                pulp::Simd::vectorize(s, Hash { r: x86::R8(s), key: &k, inputs, group, n, out: &mut out })
            }
            _ => {
                for &i in group {
                    out[i as usize] = *blake3::keyed_hash(key, inputs[i as usize]).as_bytes();
                }
            }
        }
    }
    out
}

/// One 4-ary tree node each: `parents[q] = blake3::keyed_hash(key, children[4q..4q + 4])` for
/// every `q` in `at`.
pub fn nodes4_at(key: &[u8; 32], children: &[[u8; 32]], at: &[u32], parents: &mut [[u8; 32]]) {
    nodes4_at_on(Isa::detect(), key, children, at, parents)
}

fn nodes4_at_on(isa: Isa, key: &[u8; 32], children: &[[u8; 32]], at: &[u32], parents: &mut [[u8; 32]]) {
    let k = key_words(key);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(s) => pulp::Simd::vectorize(s, Nodes4 { r: x86::R16(s), key: &k, children, at, parents }),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(s) => pulp::Simd::vectorize(s, Nodes4 { r: x86::R8(s), key: &k, children, at, parents }),
        Isa::One => {
            for &q in at {
                let q = q as usize;
                parents[q] = *blake3::keyed_hash(key, children[4 * q..4 * q + 4].as_flattened()).as_bytes();
            }
        }
    }
}

/// `out[at[i]] = blake3::keyed_hash(key, &blocks[i][..lens[i]])` for every `i`: inputs of at
/// most one block, given zero-padded to 64 bytes (so no lane copies or pads anything), each
/// hash written where it is wanted.
pub fn keyed_hash_blocks_at(key: &[u8; 32], blocks: &[[u8; BLOCK]], lens: &[u8], at: &[u32], out: &mut [[u8; 32]]) {
    keyed_hash_blocks_at_on(Isa::detect(), key, blocks, lens, at, out)
}

fn keyed_hash_blocks_at_on(
    isa: Isa,
    key: &[u8; 32],
    blocks: &[[u8; BLOCK]],
    lens: &[u8],
    at: &[u32],
    out: &mut [[u8; 32]],
) {
    assert!(blocks.len() == lens.len() && blocks.len() == at.len(), "a length and a place for each block");
    assert!(lens.iter().all(|&l| usize::from(l) <= BLOCK), "one block at most");
    let k = key_words(key);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(s) => pulp::Simd::vectorize(s, Blocks { r: x86::R16(s), key: &k, blocks, lens, at, out }),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(s) => pulp::Simd::vectorize(s, Blocks { r: x86::R8(s), key: &k, blocks, lens, at, out }),
        Isa::One => {
            for ((b, &l), &i) in blocks.iter().zip(lens).zip(at) {
                out[i as usize] = *blake3::keyed_hash(key, &b[..usize::from(l)]).as_bytes();
            }
        }
    }
}

/// [`hash_group`] as a job for [`pulp`], which runs it inside a function compiled with the
/// lane set's CPU features (`with_simd` is inlined there, and everything it calls with it).
struct Hash<'i, 'o, R> {
    r: R,
    key: &'i [u32; 8],
    inputs: &'i [&'i [u8]],
    group: &'i [u32],
    n: usize,
    out: &'o mut [[u8; 32]],
}

impl<R: Rows> pulp::WithSimd for Hash<'_, '_, R> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        hash_group(self.r, self.key, self.inputs, self.group, self.n, self.out)
    }
}

/// [`node4_group`] as a job for [`pulp`].
struct Nodes4<'i, 'o, R> {
    r: R,
    key: &'i [u32; 8],
    children: &'i [[u8; 32]],
    at: &'i [u32],
    parents: &'o mut [[u8; 32]],
}

impl<R: Rows> pulp::WithSimd for Nodes4<'_, '_, R> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        node4_group(self.r, self.key, self.children, self.at, self.parents)
    }
}

/// [`block_group`] as a job for [`pulp`].
struct Blocks<'i, 'o, R> {
    r: R,
    key: &'i [u32; 8],
    blocks: &'i [[u8; BLOCK]],
    lens: &'i [u8],
    at: &'i [u32],
    out: &'o mut [[u8; 32]],
}

impl<R: Rows> pulp::WithSimd for Blocks<'_, '_, R> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        block_group(self.r, self.key, self.blocks, self.lens, self.at, self.out)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m256i, __m512i};

    use pulp::x86::{V3, V4};

    use super::Rows;

    /// 16 lanes of AVX-512 (with its rotate instruction).
    #[derive(Clone, Copy)]
    pub(super) struct R16(pub V4);

    impl Rows for R16 {
        type Row = __m512i;
        const LANES: usize = 16;
        #[inline(always)]
        fn load(self, words: &[u32; 16]) -> __m512i {
            pulp::cast(*words)
        }
        #[inline(always)]
        fn store(self, row: __m512i) -> [u32; 16] {
            pulp::cast(row)
        }
        #[inline(always)]
        fn splat(self, w: u32) -> __m512i {
            self.0.avx512f._mm512_set1_epi32(w as i32)
        }
        #[inline(always)]
        fn add(self, a: __m512i, b: __m512i) -> __m512i {
            self.0.avx512f._mm512_add_epi32(a, b)
        }
        #[inline(always)]
        fn xor(self, a: __m512i, b: __m512i) -> __m512i {
            self.0.avx512f._mm512_xor_si512(a, b)
        }
        #[inline(always)]
        fn ror16(self, a: __m512i) -> __m512i {
            self.0.avx512f._mm512_ror_epi32::<16>(a)
        }
        #[inline(always)]
        fn ror12(self, a: __m512i) -> __m512i {
            self.0.avx512f._mm512_ror_epi32::<12>(a)
        }
        #[inline(always)]
        fn ror8(self, a: __m512i) -> __m512i {
            self.0.avx512f._mm512_ror_epi32::<8>(a)
        }
        #[inline(always)]
        fn ror7(self, a: __m512i) -> __m512i {
            self.0.avx512f._mm512_ror_epi32::<7>(a)
        }

        #[inline(always)]
        fn message(self, blocks: &[[u32; 16]; 16]) -> [__m512i; 16] {
            let mut rows = [self.splat(0); 16];
            for (row, block) in rows.iter_mut().zip(blocks) {
                *row = pulp::cast(*block);
            }
            self.transpose(rows)
        }

        /// Each block is one row as it lies in memory: x86 is little-endian, so its bytes are
        /// its words (no copy into words first).
        #[inline(always)]
        fn message_bytes(self, blocks: &[&[u8; 64]; 16]) -> [__m512i; 16] {
            let mut rows = [self.splat(0); 16];
            for (row, block) in rows.iter_mut().zip(blocks) {
                *row = pulp::cast(**block);
            }
            self.transpose(rows)
        }

        #[inline(always)]
        fn lanes(self, rows: &[__m512i; 8]) -> [[u32; 8]; 16] {
            let mut full = [self.splat(0); 16];
            full[..8].copy_from_slice(rows);
            let t = self.transpose(full);
            let mut out = [[0u32; 8]; 16];
            for (o, row) in out.iter_mut().zip(t) {
                let words: [u32; 16] = pulp::cast(row);
                o.copy_from_slice(&words[..8]);
            }
            out
        }
    }

    impl R16 {
        /// A 16 x 16 transpose of 32-bit words in four rounds of shuffles (64 in all): row
        /// `i` of the result holds word `i` of every input row.
        #[inline(always)]
        fn transpose(self, r: [__m512i; 16]) -> [__m512i; 16] {
            let f = self.0.avx512f;
            // Pairs of rows interleaved by words, then by pairs of words: b[4g + j] holds, in
            // its 128-bit lane k, word 4k + j of rows 4g..4g+4.
            let mut a = r;
            for i in (0..16).step_by(2) {
                let (x, y) = (r[i], r[i + 1]);
                a[i] = f._mm512_unpacklo_epi32(x, y);
                a[i + 1] = f._mm512_unpackhi_epi32(x, y);
            }
            let mut b = a;
            for g in 0..4 {
                for j in 0..2 {
                    let (x, y) = (a[4 * g + j], a[4 * g + 2 + j]);
                    b[4 * g + 2 * j] = f._mm512_unpacklo_epi64(x, y);
                    b[4 * g + 2 * j + 1] = f._mm512_unpackhi_epi64(x, y);
                }
            }
            // Then 128-bit lanes gathered across the four groups: word 4k + j is lane k of
            // b[j], b[4 + j], b[8 + j], b[12 + j].
            let mut out = [self.splat(0); 16];
            for j in 0..4 {
                let c0 = f._mm512_shuffle_i32x4::<0x44>(b[j], b[4 + j]);
                let c1 = f._mm512_shuffle_i32x4::<0xEE>(b[j], b[4 + j]);
                let d0 = f._mm512_shuffle_i32x4::<0x44>(b[8 + j], b[12 + j]);
                let d1 = f._mm512_shuffle_i32x4::<0xEE>(b[8 + j], b[12 + j]);
                out[j] = f._mm512_shuffle_i32x4::<0x88>(c0, d0);
                out[4 + j] = f._mm512_shuffle_i32x4::<0xDD>(c0, d0);
                out[8 + j] = f._mm512_shuffle_i32x4::<0x88>(c1, d1);
                out[12 + j] = f._mm512_shuffle_i32x4::<0xDD>(c1, d1);
            }
            out
        }
    }

    /// 8 lanes of AVX2: rotations by whole bytes are byte shuffles, the others two shifts.
    #[derive(Clone, Copy)]
    pub(super) struct R8(pub V3);

    impl R8 {
        #[inline(always)]
        fn shuffle(self, a: __m256i, table: [u8; 32]) -> __m256i {
            self.0.avx2._mm256_shuffle_epi8(a, pulp::cast(table))
        }
    }

    const ROT16: [u8; 32] = {
        let mut t = [0u8; 32];
        let mut i = 0;
        while i < 32 {
            t[i] = ((i & !3) + (i + 2) % 4) as u8;
            i += 1;
        }
        t
    };
    const ROT8: [u8; 32] = {
        let mut t = [0u8; 32];
        let mut i = 0;
        while i < 32 {
            t[i] = ((i & !3) + (i + 1) % 4) as u8;
            i += 1;
        }
        t
    };

    impl Rows for R8 {
        type Row = __m256i;
        const LANES: usize = 8;
        #[inline(always)]
        fn load(self, words: &[u32; 16]) -> __m256i {
            let mut half = [0u32; 8];
            half.copy_from_slice(&words[..8]);
            pulp::cast(half)
        }
        #[inline(always)]
        fn store(self, row: __m256i) -> [u32; 16] {
            let half: [u32; 8] = pulp::cast(row);
            let mut words = [0u32; 16];
            words[..8].copy_from_slice(&half);
            words
        }
        #[inline(always)]
        fn splat(self, w: u32) -> __m256i {
            self.0.avx._mm256_set1_epi32(w as i32)
        }
        #[inline(always)]
        fn add(self, a: __m256i, b: __m256i) -> __m256i {
            self.0.avx2._mm256_add_epi32(a, b)
        }
        #[inline(always)]
        fn xor(self, a: __m256i, b: __m256i) -> __m256i {
            self.0.avx2._mm256_xor_si256(a, b)
        }
        #[inline(always)]
        fn ror16(self, a: __m256i) -> __m256i {
            self.shuffle(a, ROT16)
        }
        #[inline(always)]
        fn ror12(self, a: __m256i) -> __m256i {
            let avx2 = self.0.avx2;
            avx2._mm256_or_si256(avx2._mm256_srli_epi32::<12>(a), avx2._mm256_slli_epi32::<20>(a))
        }
        #[inline(always)]
        fn ror8(self, a: __m256i) -> __m256i {
            self.shuffle(a, ROT8)
        }
        #[inline(always)]
        fn ror7(self, a: __m256i) -> __m256i {
            let avx2 = self.0.avx2;
            avx2._mm256_or_si256(avx2._mm256_srli_epi32::<7>(a), avx2._mm256_slli_epi32::<25>(a))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every lane set this CPU has, and the one-at-a-time path.
    fn isas() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut all = vec![Isa::One];
        #[cfg(target_arch = "x86_64")]
        {
            all.extend(pulp::x86::V3::try_new().map(Isa::Avx2));
            all.extend(pulp::x86::V4::try_new().map(Isa::Avx512));
        }
        all
    }

    proptest! {
        #[test]
        fn keyed_hashes_equal_blake3(
            key in any::<[u8; 32]>(),
            inputs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..1_300), 0..40),
        ) {
            let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            let want: Vec<[u8; 32]> = inputs.iter().map(|i| *blake3::keyed_hash(&key, i).as_bytes()).collect();
            for isa in isas() {
                prop_assert_eq!(&keyed_hash_many_on(isa, &key, &refs), &want, "{:?}", isa);
            }
        }

    }

    proptest! {
        #[test]
        fn nodes4_equal_blake3(
            key in any::<[u8; 32]>(),
            children in proptest::collection::vec(any::<[[u8; 32]; 4]>(), 1..40),
            picks in proptest::collection::vec(any::<u16>(), 0..40),
        ) {
            let flat: Vec<[u8; 32]> = children.iter().flatten().copied().collect();
            let mut at: Vec<u32> = picks.iter().map(|p| u32::from(*p) % children.len() as u32).collect();
            at.sort_unstable();
            at.dedup();
            let mut want = vec![[0u8; 32]; children.len()];
            for &q in &at {
                want[q as usize] = *blake3::keyed_hash(&key, children[q as usize].as_flattened()).as_bytes();
            }
            for isa in isas() {
                let mut got = vec![[0u8; 32]; children.len()];
                nodes4_at_on(isa, &key, &flat, &at, &mut got);
                prop_assert_eq!(&got, &want, "{:?}", isa);
            }
        }

        #[test]
        fn one_block_hashes_equal_blake3(key in any::<[u8; 32]>(), inputs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..=64), 0..40)) {
            let want: Vec<[u8; 32]> = inputs.iter().map(|i| *blake3::keyed_hash(&key, i).as_bytes()).collect();
            let blocks: Vec<[u8; 64]> = inputs.iter().map(|i| { let mut b = [0u8; 64]; b[..i.len()].copy_from_slice(i); b }).collect();
            let lens: Vec<u8> = inputs.iter().map(|i| i.len() as u8).collect();
            // Written in reverse order, to check each lands where `at` says.
            let at: Vec<u32> = (0..inputs.len() as u32).rev().collect();
            let reversed: Vec<[u8; 32]> = want.iter().rev().copied().collect();
            for isa in isas() {
                let mut out = vec![[0u8; 32]; inputs.len()];
                keyed_hash_blocks_at_on(isa, &key, &blocks, &lens, &at, &mut out);
                prop_assert_eq!(&out, &reversed, "{:?}", isa);
            }
        }
    }

    /// Every block count a chunk can have, across full batches and a partial last one.
    #[test]
    fn every_block_count_and_batch_shape_equals_blake3() {
        let key = *b"metatopia/wide/test/key_________";
        let inputs: Vec<Vec<u8>> = (0..=1_025usize)
            .step_by(7)
            .chain([0, 64, 128, 1_024])
            .flat_map(|len| (0..3u8).map(move |s| (0..len).map(|i| (i as u8) ^ s.wrapping_mul(37)).collect()))
            .collect();
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let want: Vec<[u8; 32]> = inputs.iter().map(|i| *blake3::keyed_hash(&key, i).as_bytes()).collect();
        let children: Vec<[u8; 32]> = (0..4 * 37u8).map(|i| [i ^ 0x5a; 32]).collect();
        let at: Vec<u32> = (0..37).collect();
        let want_nodes: Vec<[u8; 32]> =
            children.chunks_exact(4).map(|c| *blake3::keyed_hash(&key, c.as_flattened()).as_bytes()).collect();
        for isa in isas() {
            assert_eq!(keyed_hash_many_on(isa, &key, &refs), want, "{isa:?}");
            let mut nodes = vec![[0u8; 32]; 37];
            nodes4_at_on(isa, &key, &children, &at, &mut nodes);
            assert_eq!(nodes, want_nodes, "{isa:?}");
        }
    }
}
