//! The question set on the bundled model: greedy answers of the native kernels agree with the float reference path
//! (every matrix dequantized, activations in f32) on at least 19 of the 20 questions under each system prompt.
//! With 8-bit activations about 13 of 20 agreed; see docs/worker.md, "Quality".
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use zl_worker::eval::answers::{self, QUESTIONS, SYSTEM_PROMPTS};
use zl_worker::fetch;
use zl_worker::model::{Precision, load_with};

#[test]
fn greedy_answers_agree_with_the_float_reference_path() {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let native = load_with(&path, Precision::Native).unwrap();
    let float = load_with(&path, Precision::Float).unwrap();
    let results = answers::compare((&native.llama, &native.tokenizer), &float.llama, 24).unwrap();
    assert_eq!(results.len(), QUESTIONS.len() * SYSTEM_PROMPTS.len());
    for system in SYSTEM_PROMPTS {
        let set: Vec<_> = results.iter().filter(|c| c.system == system).collect();
        let differ: Vec<_> = set.iter().filter(|c| !c.agrees()).collect();
        for c in &differ {
            eprintln!("{system:?} {}\n  native: {:?}\n  float:  {:?}", c.question, c.answer, c.reference);
        }
        assert!(differ.len() <= 1, "{system:?}: {} of {} answers differ", differ.len(), set.len());
        // The answers are real text, not empty continuations.
        assert!(set.iter().all(|c| !answers::first_sentence(&c.reference).is_empty()), "{system:?}");
    }
    // The question the issue was filed about, under the usual system prompt: both paths name Paris.
    let france = results.iter().find(|c| c.system == SYSTEM_PROMPTS[0] && c.question == QUESTIONS[0]).unwrap();
    assert!(france.answer.contains("Paris") && france.reference.contains("Paris"), "{france:?}");
}
