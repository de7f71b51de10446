//! The GPU against the CPU on the bundled model (`cuda` builds only; scripts/gpu-check runs it on a GPU machine,
//! with `ZL_TEST_DEVICE` naming the device, `cuda:0` by default): both answer the plain question right, and how
//! many greedy tokens the two agree on before they part is printed (the GPU's reductions run in other orders than
//! the CPU's SIMD kernels, and its weights are half precision rather than Q4_1 blocks, so the bits differ).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use zl_text::ChatMessage;
use zl_worker::device::Device;
use zl_worker::engine::{EngineCore, Event, Request};
use zl_worker::fetch;
use zl_worker::kv::window::KvLayout;
use zl_worker::model::gguf;
use zl_worker::sampling::Sampling;
use zl_worker::scheduler::SchedulerConfig;

fn greedy(device: Device, question: &str) -> (Vec<u32>, String) {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let mut e =
        EngineCore::on_device(gguf::load(&path).unwrap(), device, KvLayout::full(256), 16, SchedulerConfig::default())
            .unwrap();
    let tok = &e.model().tokenizer;
    let messages = [
        ChatMessage { role: "system".into(), content: "You are a helpful assistant.".into() },
        ChatMessage { role: "user".into(), content: question.into() },
    ];
    let prompt = tok.encode(&tok.render_chat(&messages).unwrap()).unwrap();
    let req = Request::new(prompt, Sampling::greedy(), 32);
    e.add(1, req).unwrap();
    let (mut tokens, mut text) = (Vec::new(), String::new());
    while e.has_work() {
        for ev in e.step() {
            match ev {
                Event::Token { token, text: t, .. } => {
                    tokens.push(token);
                    text.push_str(&t);
                }
                Event::Finished { text: t, .. } => text.push_str(&t),
                Event::Prompt { .. } => {}
            }
        }
    }
    (tokens, text)
}

#[test]
fn the_gpu_answers_as_the_cpu_does() {
    let mut device = Device::from_env("ZL_TEST_DEVICE").unwrap();
    if device == Device::Cpu {
        device = Device::Cuda(0);
    }
    let questions = ["What is the capital of France?", "Name three primary colours.", "What is 12 plus 30?"];
    for (i, q) in questions.iter().enumerate() {
        let (gpu, gpu_text) = greedy(device, q);
        let (cpu, cpu_text) = greedy(Device::Cpu, q);
        let same = gpu.iter().zip(&cpu).take_while(|(a, b)| a == b).count();
        println!("{q:?}: {same} of {} greedy tokens agree\n  gpu: {gpu_text:?}\n  cpu: {cpu_text:?}", cpu.len());
        if i == 0 {
            assert!(gpu_text.contains("Paris"), "the GPU answered {gpu_text:?}");
        }
    }
}
