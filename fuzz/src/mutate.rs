//! A small mutator for the stable runner: no coverage feedback, but the same kinds of edits
//! libFuzzer makes (bit flips, interesting bytes, inserted and deleted ranges, duplicated chunks,
//! splices with another input, dictionary tokens), seeded so a failure can be replayed.

/// xorshift64*: deterministic for a seed, good enough to pick edits.
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (0 is replaced, xorshift's fixed point).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Tokens that matter to the parsers under test.
const DICTIONARY: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"true",
    b"-0",
    b"1e999",
    b"\\u0000",
    b"\\ud800",
    b"\"jsonrpc\":\"2.0\"",
    b"\"method\"",
    b"\"params\"",
    b"\"id\"",
    b"\"_meta\"",
    b"\"name\"",
    b"\"arguments\"",
    b"tools/call",
    b"tools/list",
    b"initialize",
    b"server/discover",
    b"$SESSION",
    b"2026-07-28",
    b"2025-06-18",
    b"\r\n",
    b"\n",
    b"%2e%2e",
    b"..",
    b"/",
    b"{id}",
    b"~1",
    b"~0",
    b"*",
    b"$ref",
    b"\"#\"",
    b"pattern",
    b"::ffff:",
    b"/0",
    b"/128",
    b"[::1]:80",
    b"00-",
    b"eyJ",
    b".",
    b"alg",
    b"none",
    b"tg1.",
    b"\xff",
    b"\x00",
];

const INTERESTING: &[u8] = &[0, 1, 0x7f, 0x80, 0xff, b'0', b'9', b'"', b'\\', b'{', b'[', b'\n'];

/// One to four edits of `input`, sometimes spliced with `other`, at most `max_len` bytes.
pub fn mutate(input: &[u8], other: &[u8], rng: &mut Rng, max_len: usize) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = out.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                out[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(16)).min(len);
                out.drain(start..end);
            }
            3 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(32)).min(len);
                let chunk = out[start..end].to_vec();
                let at = rng.below(out.len() + 1);
                out.splice(
                    at..at,
                    chunk.iter().copied().cycle().take(chunk.len() * (1 + rng.below(4))),
                );
            }
            4 if !other.is_empty() => {
                let cut = rng.below(out.len() + 1);
                let from = rng.below(other.len());
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            5 => {
                let at = rng.below(out.len() + 1);
                let token = DICTIONARY[rng.below(DICTIONARY.len())];
                out.splice(at..at, token.iter().copied());
            }
            6 => {
                let at = rng.below(out.len() + 1);
                out.insert(at, rng.next_u64() as u8);
            }
            _ if len > 1 => {
                // Replace a range with copies of one byte (long strings, deep nesting).
                let at = rng.below(len);
                let b = [b'[', b'{', b'a', b'"', b'9'][rng.below(5)];
                let n = 1 + rng.below(256);
                out.splice(at..at, std::iter::repeat_n(b, n));
            }
            _ => out.push(rng.next_u64() as u8),
        }
    }
    out.truncate(max_len);
    out
}
