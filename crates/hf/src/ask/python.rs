//! The Python a plan prints: the same task as transformers, peft and
//! bitsandbytes run it, ending with the peaks PyTorch measured.

use super::{attention_name, task_attention, Asked};
use crate::config::HfConfig;
use crate::generate::{Cache, Generation};
use crate::plan::{Task, Training};
use crate::step::Quant4;

/// The Python that runs the same task and prints its peaks.
pub fn python(a: &Asked) -> String {
    let q = &a.question;
    if let Task::Train(
        t @ Training {
            quant: Some(q4), ..
        },
    ) = q.task
    {
        return qlora_python(a, t, q4);
    }
    let head = format!(
        "import torch  # {}: the cuBLAS workspaces of this release\n\
         from transformers import AutoConfig, AutoModelForCausalLM\n\n\
         config = {}\n\
         model = AutoModelForCausalLM.from_config(config, dtype=torch.{}, attn_implementation=\"{}\").to(\"cuda\")\n",
        q.torch.id(),
        a.load,
        q.dtype.torch_name(),
        attention_name(task_attention(&q.task)),
    );
    let body = match q.task {
        Task::Generate(g) => generate_python(g),
        Task::Train(t) => train_python(&q.config, t),
    };
    format!(
        "{head}{body}print(torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())\n"
    )
}

fn generate_python(g: Generation) -> String {
    let static_cache = if g.cache == Cache::Static {
        ", cache_implementation=\"static\", disable_compile=True"
    } else {
        ""
    };
    format!(
        "ids = torch.randint(0, config.vocab_size, ({}, {}), device=\"cuda\")\n\
         with torch.no_grad():\n    \
         model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens={}, do_sample=False{static_cache})\n",
        g.batch, g.prompt, g.new_tokens
    )
}

/// QLoRA as people run it: the model saved (random weights: the memory
/// is the same) and loaded in 4 bits, readied for k-bit training, LoRA on
/// every linear layer, two steps.
fn qlora_python(a: &Asked, t: Training, q4: Quant4) -> String {
    let q = &a.question;
    let rank = t.lora.unwrap_or(16);
    let (import, optimizer) = match t.adam8bit {
        true => ("import bitsandbytes as bnb8\n", "bnb8.optim.AdamW8bit"),
        false => ("", "torch.optim.AdamW"),
    };
    let steps = format!("{import}{}", steps_python(t, optimizer));
    format!(
        "import torch  # {}\n\
         from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training\n\
         from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig\n\n\
         config = {}\n\
         AutoModelForCausalLM.from_config(config, dtype=torch.{dt}).save_pretrained(\"model\")\n\
         bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"{}\", bnb_4bit_use_double_quant={}, bnb_4bit_compute_dtype=torch.{dt})\n\
         model = AutoModelForCausalLM.from_pretrained(\"model\", quantization_config=bnb, dtype=torch.{dt}, device_map={{\"\": 0}}, attn_implementation=\"{}\")\n\
         model = prepare_model_for_kbit_training(model, use_gradient_checkpointing={})\n\
         model = get_peft_model(model, LoraConfig(r={rank}, lora_alpha={}, lora_dropout=0.0, target_modules=\"all-linear\", task_type=\"CAUSAL_LM\"))\n\
         {steps}print(torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())\n",
        q.torch.id(),
        a.load,
        if q4.nf4 { "nf4" } else { "fp4" },
        if q4.double_quant { "True" } else { "False" },
        attention_name(t.attention),
        if t.checkpointing { "True" } else { "False" },
        2 * rank,
        dt = q.dtype.torch_name(),
    )
}

/// The training loop: two steps (the second is the one with the
/// optimizer's state made).
fn steps_python(t: Training, optimizer: &str) -> String {
    format!(
        "model.train()\n\
         opt = {optimizer}([p for p in model.parameters() if p.requires_grad], lr=1e-5)\n\
         ids = torch.randint(0, config.vocab_size, ({}, {}), device=\"cuda\")\n\
         for _ in range(2):\n    \
         {}\
         loss.backward()\n    \
         opt.step()\n    \
         opt.zero_grad(set_to_none=True)\n",
        t.batch,
        t.seq,
        match t.amp {
            Some(_) => "with torch.autocast(\"cuda\", dtype=torch.bfloat16):\n        loss = model(input_ids=ids, labels=ids).loss\n    ",
            None => "loss = model(input_ids=ids, labels=ids).loss\n    ",
        }
    )
}

/// Two steps (the second is the one with AdamW's state made).
fn train_python(c: &HfConfig, t: Training) -> String {
    let mut s = String::new();
    if t.checkpointing {
        s.push_str("model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})\n");
    }
    if let Some(rank) = t.lora {
        let targets: Vec<String> = (crate::step::lora_targets(c.arch).iter())
            .map(|t| format!("{t:?}"))
            .collect();
        s.push_str(&format!(
            "from peft import LoraConfig, get_peft_model\n\
             model = get_peft_model(model, LoraConfig(r={rank}, lora_alpha={}, lora_dropout=0.0, target_modules=[{}]))\n",
            2 * rank,
            targets.join(", ")
        ));
    }
    let optimizer = match t.adam8bit {
        true => {
            s.push_str("import bitsandbytes as bnb\n");
            "bnb.optim.AdamW8bit"
        }
        false => "torch.optim.AdamW",
    };
    s.push_str(&steps_python(t, optimizer));
    s
}
