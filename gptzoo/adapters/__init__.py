"""Low-rank adapters: what a model offers (targets), the adapter module (lora), peft's on-disk format
(peft_format), and fine-tuning with them (finetune)."""
