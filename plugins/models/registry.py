"""Every built-in model architecture, registered by lazy ``"module:Class"`` targets.

This is the entry-point module (``models`` in group ``octavo``). It imports nothing heavy, because every
process loads every plugin module; a model's module (and torch) is imported only when a checkpoint of
that architecture is loaded. Built-ins are ``trylast``, so an installed plugin shadows them.
"""

from octavo import hookimpl

_PKG = "octavo.plugins.models"

# Hugging Face ``architectures`` name -> "module:Class"
MODELS = {
    "LlamaForCausalLM": f"{_PKG}.llama:LlamaForCausalLM",
    "MistralForCausalLM": f"{_PKG}.llama:MistralForCausalLM",
    "Qwen2ForCausalLM": f"{_PKG}.llama:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": f"{_PKG}.qwen3:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": f"{_PKG}.qwen3:Qwen3MoeForCausalLM",
    "MixtralForCausalLM": f"{_PKG}.mixtral:MixtralForCausalLM",
    "GemmaForCausalLM": f"{_PKG}.gemma:GemmaForCausalLM",
    "Gemma2ForCausalLM": f"{_PKG}.gemma:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": f"{_PKG}.gemma:Gemma3ForCausalLM",
    "Phi3ForCausalLM": f"{_PKG}.phi3:Phi3ForCausalLM",
    "GPT2LMHeadModel": f"{_PKG}.gpt2:GPT2LMHeadModel",
    "OPTForCausalLM": f"{_PKG}.opt:OPTForCausalLM",
    "BertModel": f"{_PKG}.bert:BertModel",
    "XLMRobertaModel": f"{_PKG}.bert_classify:XLMRobertaModel",
    "RobertaModel": f"{_PKG}.bert_classify:XLMRobertaModel",
    "BertForSequenceClassification": f"{_PKG}.bert_classify:BertForSequenceClassification",
    "XLMRobertaForSequenceClassification": f"{_PKG}.bert_classify:XLMRobertaForSequenceClassification",
    "RobertaForSequenceClassification": f"{_PKG}.bert_classify:XLMRobertaForSequenceClassification",
    "LlamaForSequenceClassification": f"{_PKG}.seq_cls:LlamaForSequenceClassification",
    "MistralForSequenceClassification": f"{_PKG}.seq_cls:MistralForSequenceClassification",
    "Qwen2ForSequenceClassification": f"{_PKG}.seq_cls:Qwen2ForSequenceClassification",
    "Qwen3ForSequenceClassification": f"{_PKG}.seq_cls:Qwen3ForSequenceClassification",
    "LlavaForConditionalGeneration": f"{_PKG}.llava:LlavaForConditionalGeneration",
    "Qwen2VLForConditionalGeneration": f"{_PKG}.qwen2_vl:Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration": f"{_PKG}.qwen2_5_vl:Qwen2_5_VLForConditionalGeneration",
}


@hookimpl(trylast=True)
def octavo_register_models(register):
    for architecture, target in MODELS.items():
        register(architecture, target)
