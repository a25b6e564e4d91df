//! Property tests of the elastic-spec grammar: no input panics it, errors stay short,
//! and every accepted spec survives a round trip through its canonical form.
//! The main test runs over 1,200,000 generated inputs (bytes, token soups, mutated specs);
//! proptest adds four properties of 20,000 cases each, with shrinking.

use bftrainer_core::spec::{self, ElasticSpec, Role, KEYS};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Fragments that sit near the grammar's edges, so random concatenations hit deep paths.
const TOKENS: &[&str] = &[
    "0",
    "1",
    "2",
    "8",
    "16",
    "007",
    "-1",
    "+3",
    "4294967295",
    "4294967296",
    "18446744073709551616",
    ":",
    ",",
    "=",
    "up",
    "down",
    "profile",
    "role",
    "parent",
    "core",
    "satellite",
    "x",
    "..",
    "/",
    "a-b_c.d",
    "86400",
    "86401",
    " ",
    "\u{0}",
    "\u{ff}",
    "é",
    "２",
    "",
];

/// SplitMix64: a dependency-free, seeded generator, fast enough in debug builds to
/// drive a million inputs in seconds (proptest's machinery costs ~60 us per case there).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One generated input: random bytes, a soup of grammar tokens, or a valid spec with a
/// byte mutated, chosen in turn so each kind gets a third of the budget.
fn generate(rng: &mut Mix, i: u64, out: &mut Vec<u8>) {
    const SEEDS: &[&str] = &[
        "2:16",
        "1:8,up=30,down=5,profile=p.v2",
        "1:1,role=satellite,parent=9",
        "4,role=core",
    ];
    out.clear();
    match i % 3 {
        0 => {
            let len = if rng.below(50) == 0 {
                240 + rng.below(40)
            } else {
                rng.below(24)
            };
            out.extend((0..len).map(|_| rng.next() as u8));
        }
        1 => {
            for _ in 0..rng.below(12) {
                out.extend_from_slice(TOKENS[rng.below(TOKENS.len())].as_bytes());
            }
        }
        _ => {
            out.extend_from_slice(SEEDS[rng.below(SEEDS.len())].as_bytes());
            for _ in 0..rng.below(3) {
                let at = rng.below(out.len() + 1);
                let byte = b"0123456789:,=-x"[rng.below(15)];
                match rng.below(3) {
                    0 => out.insert(at, byte),
                    1 if at < out.len() => {
                        out.remove(at);
                    }
                    _ if at < out.len() => out[at] = byte,
                    _ => {}
                }
            }
        }
    }
}

fn valid() -> impl Strategy<Value = ElasticSpec> {
    (
        1u32..=u32::MAX,
        any::<Option<u32>>(),
        prop::option::of(0u32..=86_400),
        prop::option::of(0u32..=86_400),
        prop::option::of("[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}"),
        prop::option::of(1u32..=u32::MAX),
        prop::option::of((1u32..=spec::MAX_BATCH, 0u32..=spec::MAX_BATCH)),
        prop::option::of(prop::sample::select(vec![
            spec::LrRule::None,
            spec::LrRule::Linear,
            spec::LrRule::Sqrt,
        ])),
    )
        .prop_map(
            |(min, extra, up, down, profile, parent, batch, lr)| ElasticSpec {
                min,
                max: extra.map(|e| min.saturating_add(e % 1000)),
                up,
                down,
                profile,
                batch: batch.map(|(a, e)| (a, a.saturating_add(e).min(spec::MAX_BATCH))),
                lr: lr.filter(|_| batch.is_some()),
                role: if parent.is_some() {
                    Role::Satellite
                } else {
                    Role::Core
                },
                parent,
            },
        )
}

fn check_any(input: &[u8]) -> Result<(), TestCaseError> {
    match spec::parse_bytes(input) {
        Ok(s) => {
            let canon = s.to_string();
            prop_assert!(
                canon.len() <= input.len(),
                "canonical {canon:?} longer than input"
            );
            let again = spec::parse(&canon);
            prop_assert_eq!(again.as_ref(), Ok(&s));
            prop_assert_eq!(spec::parse_tag(&s.to_tag()), Some(Ok(s.clone())));
            prop_assert!(s.max.map_or(true, |m| m >= s.min) && s.min >= 1);
        }
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(msg.starts_with("--elastic="));
            // Echo is capped, so even a 100 kB value gives a short message.
            prop_assert!(msg.len() < 400, "message too long: {}", msg.len());
            prop_assert!(!msg.contains('\n'));
        }
    }
    Ok(())
}

#[test]
fn grammar_never_panics_over_1_200_000_inputs() {
    let mut rng = Mix(0x00b7_7a1e_2026);
    let mut input = Vec::new();
    let (mut total, mut accepted) = (0u64, 0u64);
    for i in 0..1_200_000u64 {
        generate(&mut rng, i, &mut input);
        total += 1;
        accepted += u64::from(spec::parse_bytes(&input).is_ok());
        if let Err(e) = check_any(&input) {
            panic!("input {:?}: {e}", String::from_utf8_lossy(&input));
        }
    }
    assert_eq!(total, 1_200_000);
    // The generators must reach the accepting paths too, or the round trip proves nothing.
    assert!(accepted >= 100_000, "only {accepted} inputs were valid");
    eprintln!("{total} inputs, {accepted} accepted");
}

proptest! {
    #![proptest_config(Config { cases: 20_000, failure_persistence: None, ..Config::default() })]

    #[test]
    fn valid_specs_round_trip(s in valid()) {
        let text = s.to_string();
        prop_assert_eq!(spec::parse(&text), Ok(s.clone()));
        check_any(text.as_bytes())?;
    }

    #[test]
    fn raw_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..300)) {
        check_any(&b)?;
    }

    #[test]
    fn key_order_does_not_matter(s in valid()) {
        let mut items: Vec<String> = s.to_string().split(',').skip(1).map(String::from).collect();
        items.reverse();
        let bounds = s.to_string().split(',').next().unwrap().to_string();
        let text = std::iter::once(bounds).chain(items).collect::<Vec<_>>().join(",");
        prop_assert_eq!(spec::parse(&text), Ok(s));
    }

    #[test]
    fn every_key_duplicated_is_rejected(k in 0..KEYS.len()) {
        let pair = match KEYS[k] { "up" | "down" => "1", "profile" => "p", "role" => "core", "lr" => "linear", _ => "5" };
        let text = format!("1:2,{key}={pair},{key}={pair}", key = KEYS[k]);
        let e = spec::parse(&text).unwrap_err().to_string();
        prop_assert!(e.contains("is given twice"), "{}", e);
    }
}
