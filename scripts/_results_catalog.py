"""The tables of docs/results.md: which results file, under which title, with which columns
(read by ``scripts/gen_results.py``)."""

from __future__ import annotations

#: (results file, title, columns to show; None = all scalar columns)
#: the columns of every quick-start / recipe table and of every QKD-ablation table
QUICKSTART_COLUMNS = [
    "method",
    "large_tower",
    "query_tower",
    "query_layers",
    "val_ndcg@10",
    "ndcg@10",
    "r@100",
    "p_vs_prev",
    "p_vs_best_baseline",
    "query_qps",
    "p99_ms",
    "chosen",
]
QKD_ABLATION_COLUMNS = [
    "qkd_run",
    "corpus_texts",
    "student",
    "teacher",
    "qkd_queries",
    "steps",
    "best_step",
    "train_seconds",
    "val_ndcg@10",
    "ndcg@10",
    "r@100",
    "delta_vs_first",
    "p_vs_first",
]

TABLES: list[tuple[str, str, list[str] | None]] = [
    (
        "recipe_scifact",
        "The quick-start recipe on SciFact (`python -m benchmarks.recipe --data scifact`: every choice on validation "
        "queries; the paper's comparison at matched online cost per family; full test split and corpus)",
        QUICKSTART_COLUMNS,
    ),
    (
        "recipe_kuake_qtr",
        "The quick-start recipe on KUAKE-QTR (`python -m benchmarks.recipe --data kuake_qtr`)",
        QUICKSTART_COLUMNS,
    ),
    (
        "recipe_synthetic",
        "The quick-start recipe on the synthetic note-search log (`python -m benchmarks.recipe --data synthetic`)",
        QUICKSTART_COLUMNS,
    ),
    (
        "recipe_scifact_p99_5ms",
        "The SciFact recipe with a latency budget (`python -m benchmarks.recipe --data scifact --student-p99-ms 5 "
        '--set \'students=["bert:1","bert:2"]\' --tag p99_5ms`: the best-validating student whose single-query p99 '
        "is under 5 ms is served)",
        QUICKSTART_COLUMNS,
    ),
    (
        "recipe_synthetic_p99_3.5ms",
        "The synthetic recipe with a latency budget (`python -m benchmarks.recipe --data synthetic --student-p99-ms "
        "3.5 --tag p99_3.5ms`: every readable family's student at 1..its small size; the best-validating one whose "
        "single-query p99 is under 3.5 ms is served)",
        QUICKSTART_COLUMNS,
    ),
    (
        "recipe_synthetic_p99_3ms",
        "The synthetic recipe with a 3 ms latency budget (`python -m benchmarks.recipe --data synthetic "
        "--student-p99-ms 3 --tag p99_3ms`)",
        QUICKSTART_COLUMNS,
    ),
    (
        "qkd_listwise",
        "QKD with and without its listwise term, same teacher and steps (`python -m benchmarks.qkd_listwise`; val = "
        "the teacher's held-out validation queries, never distilled on; p = paired t-test vs the first row of the "
        "data set)",
        [
            "data",
            "student",
            "rank_weight",
            "epochs",
            "steps_run",
            "best_step",
            "train_queries",
            "train_seconds",
            "val_ndcg@10",
            "val_p_vs_first",
            "ndcg@10",
            "r@100",
            "p_vs_first",
        ],
    ),
    (
        "qkd_corpus_texts_synthetic",
        "QKD's query pool with and without the corpus's titles and sentences (synthetic log, quick start) (`python -m "
        "benchmarks.qkd_corpus_texts`; row as_run = the run's own student; p = paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "qkd_corpus_texts_scifact",
        "QKD's query pool with and without the corpus's titles and sentences (SciFact recipe) (`python -m "
        "benchmarks.qkd_corpus_texts --run runs/recipe/scifact --texts 10000`; row as_run = the run's own student; p "
        "= paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "qkd_corpus_texts_kuake_qtr",
        "QKD's query pool with and without the corpus's titles and sentences (KUAKE-QTR recipe) (`python -m "
        "benchmarks.qkd_corpus_texts --run runs/recipe/kuake_qtr --texts 10000`; row as_run = the run's own student; "
        "p = paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "qkd_corpus_texts_synthetic_steps",
        "QKD with and without its 1,000-step cap, the quick start's teacher and student (synthetic log) (`python -m "
        "benchmarks.qkd_corpus_texts --texts 10000 --qkd-max-steps none --name synthetic_steps`; row as_run = the "
        "run's own student; p = paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "qkd_corpus_texts_synthetic_dropout",
        "QKD with the student's dropout off beside the base model's 0.1 (synthetic log, 900 steps) (`python -m "
        "benchmarks.qkd_corpus_texts --run runs/quickstart_s15 --texts 10000 --qkd-dropout 0 --name "
        "synthetic_dropout`; row as_run = the run's own student; p = paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "qkd_corpus_texts_synthetic_cap",
        "QKD at 800 and 900 steps beside the run's 1,000 (synthetic log, the CPU cap of `qkd_max_steps: auto`) "
        "(`python -m benchmarks.qkd_corpus_texts --run runs/quickstart_s14 --texts 10000 --qkd-max-steps 800 "
        "--qkd-max-steps 900 --name synthetic_cap`; row as_run = the run's own student; p = paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "hybrid_scifact",
        "Hybrid BM25 + dense on SciFact (`python -m benchmarks.hybrid --dataset scifact`; dense side in the config)",
        None,
    ),
    ("hybrid_kuake_qtr", "Hybrid BM25 + dense on KUAKE-QTR", None),
    ("fsdp_memory", "FSDP2 vs DDP memory per process (SmolLM2 full depth + MiniLM, 2 processes, gloo, CPU)", None),
    (
        "qkd_distributed",
        "QKD in one process vs two torchrun processes (DDP, FSDP2) on SciFact (`python -m "
        "benchmarks.qkd_distributed`; MiniLM-2L student of the depth-2 ScalingDual teacher; row `start` = after the "
        "head fit, before training)",
        [
            "run",
            "processes",
            "distributed",
            "steps_run",
            "best_step",
            "start_val_loss",
            "qkd_val_loss",
            "ndcg@10",
            "r@100",
            "ndcg@10_minus_1proc",
            "train_seconds",
            "steps_per_s",
        ],
    ),
    ("export", "Exported query towers: torch vs ONNX fp32 / int8", None),
    (
        "bm25",
        "BM25 baseline (test splits)",
        ["dataset", "language", "queries", "ndcg@10", "recall@100", "r@100", "mrr@10", "map"],
    ),
    ("stage1_scifact", "Stage I on SciFact (train -> test; SmolLM2 mean pooling, centre + PCA head init)", None),
    (
        "llm_pooling_scifact",
        "Zero-shot SmolLM2 by depth and pooling (SciFact sub-corpus; why the LLM towers mean-pool on CPU)",
        None,
    ),
    (
        "stage1_scifact_placeholder",
        "Stage I on SciFact with the paper's placeholder pooling (earlier run: random head, 2 layers)",
        None,
    ),
    ("stage1_kuake_qtr", "Stage I on KUAKE-QTR (train -> test)", None),
    ("qkd_scifact", "Stage II (QKD) students on SciFact", None),
    (
        "quickstart_synthetic",
        "Quick start on the embedded defaults (synthetic note-search log; `bash scripts/quickstart.sh`)",
        QUICKSTART_COLUMNS,
    ),
    (
        "quickstart_synthetic_gpu",
        "Quick start on the embedded defaults on an NVIDIA H100 (`scripts/device_quickstart.sh`: bf16 autocast, "
        "`unfreeze_layers: auto` = 1; query_qps = batch encoding on the GPU)",
        QUICKSTART_COLUMNS,
    ),
    (
        "quickstart_synthetic_gpu_top2",
        "The same on the H100 with `--set unfreeze_layers=2` (the chosen large towers' top two layers trained from "
        "their heads)",
        QUICKSTART_COLUMNS,
    ),
    (
        "quickstart_synthetic_unfreeze1",
        "The quick start's CPU run with `--set unfreeze_layers=1` (every other step reused; `python -m "
        "benchmarks.quickstart --from-run ... --tag unfreeze1 --reused`): val_curve = step:validation nDCG@10 of each "
        "large tower's Stage I run, step 0 = its start (the heads, for the top-layer rows)",
        [
            "method",
            "large_tower",
            "query_tower",
            "val_ndcg@10",
            "ndcg@10",
            "best_step",
            "train_seconds",
            "val_curve",
            "chosen",
        ],
    ),
    (
        "quickstart_equivalence",
        "The quick start from two commits with the same settings (the config names both commits and the settings), "
        "every number of results.json, the choices and each step's run.json compared at the config's tolerance; "
        "timings left out (`python -m benchmarks.quickstart_equivalence`)",
        None,
    ),
    ("quickstart_fresh_clone", "README command 1 on a fresh clone, timed (`python -m benchmarks.fresh_clone`)", None),
    (
        "quickstart_scifact",
        "Quick start on SciFact (`scalingnote quickstart --data ../shared/data/scifact --set evaluate_start=true`: "
        "start_* columns = each method before training; the other columns are what the default command gives)",
        None,
    ),
    (
        "quickstart_kuake_qtr",
        "Quick start on KUAKE-QTR (`scalingnote quickstart --data ../shared/data/kuake_qtr`)",
        None,
    ),
    ("index_scifact", "Indexes on SciFact (MiniLM embeddings)", None),
    ("index_synthetic_1m", "Indexes on 1M synthetic clustered vectors", None),
    ("tmj_scifact", "Learned PQ (TMJ) on SciFact", None),
    ("encode_throughput", "Encoding throughput (CPU, fp32, 2 threads)", None),
    ("data_stats", "Training-data statistics", None),
    ("learnability", "Is the synthetic log learnable? TwinBERT on real vs shuffled triplets", None),
    ("serve_loadtest", "Online service load test", None),
    (
        "fuzz",
        "Fuzzing: readers (hypothesis) and the service (schemathesis); failures must be 0",
        ["kind", "target", "mode", "examples", "ok", "data_error", "failures", "seconds"],
    ),
    (
        "chaos",
        "Chaos: SIGKILL at a seeded random moment, then the same command again",
        [
            "trial",
            "stage",
            "kill_at_s",
            "reference_s",
            "killed",
            "half_written_files",
            "resumed_ok",
            "outputs_identical",
            "differing",
        ],
    ),
    ("soak", "Soak: the service under closed-loop load (per window)", None),
    (
        "faults",
        "Write faults on the live index: every write point fails once in turn (in-process), and a real 8 MB tmpfs "
        "filled, freed, SIGKILLed "
        "(`python -m benchmarks.faults`); after each restart a history checker counts lost, resurrected and "
        "duplicated documents (all must be 0)",
        None,
    ),
    ("scaling_fit", "Scaling-law fits (heads only over frozen towers: `python -m benchmarks.scaling_sweep`)", None),
    (
        "scaling_trained_fit",
        "Scaling laws over towers whose every layer trains (`python -m benchmarks.scaling_trained`; MiniLM 1-6 and "
        "SmolLM2 1-6 layers on SciFact; "
        "held-out points predicted before they were trained, see `scaling_trained_predictions.json`)",
        [
            "fit",
            "check",
            "law",
            "points",
            "r2",
            "A",
            "alpha",
            "B",
            "beta",
            "delta",
            "at_bound",
            "depth",
            "N",
            "D",
            "budget",
            "predicted",
            "measured",
            "rel_err",
            "within_5pct",
        ],
    ),
    (
        "scaling_trained_sweep",
        "Points of the trained scaling sweep (loss = test contrastive perplexity; dev curve = step:dev loss)",
        [
            "role",
            "depth",
            "N",
            "D",
            "human_pairs",
            "loss",
            "ndcg@10",
            "r@100",
            "start_dev_contrastive_ppl",
            "dev_contrastive_ppl",
            "best_step",
            "steps_run",
            "train_seconds",
            "dev_curve",
        ],
    ),
    (
        "scaling_trained_gpu200_fit",
        "The SmolLM2 model-size law up to the whole 30-layer tower, every layer trained, on an NVIDIA H200 "
        "(`bash scripts/device_scaling_trained.sh`: family `smollm2_full`, 1-16 layers fitted, 30 held out and "
        "predicted before it trained; "
        "the protocol of `scaling_trained_fit`, 200 steps, bf16 autocast)",
        [
            "fit",
            "check",
            "law",
            "points",
            "r2",
            "A",
            "alpha",
            "delta",
            "depth",
            "N",
            "D",
            "predicted",
            "measured",
            "rel_err",
            "within_5pct",
        ],
    ),
    (
        "scaling_trained_gpu200_sweep",
        "Its points (loss = test contrastive perplexity; p = paired t-test of the per-query loss against the next "
        "shallower depth)",
        [
            "role",
            "depth",
            "N",
            "D",
            "loss",
            "loss_se",
            "ndcg@10",
            "r@100",
            "delta_loss_vs_shallower",
            "p_vs_shallower",
            "start_dev_contrastive_ppl",
            "dev_contrastive_ppl",
            "best_step",
            "steps_run",
            "train_seconds",
        ],
    ),
    (
        "llm_layers_scifact",
        "The document-tower depth curve with trained LLM layers (ScalingNote §4.4; `python -m "
        "benchmarks.llm_layers`): SmolLM2 "
        "ScalingDual, heads only vs the top k layers of both towers trained from those heads",
        [
            "depth",
            "trainable_layers",
            "tower",
            "ndcg@10",
            "r@100",
            "contrastive_ppl",
            "start_ndcg@10",
            "val_ndcg@10",
            "val_curve",
            "best_step",
            "steps_run",
            "train_seconds",
            "cache_gb",
            "delta_ndcg@10_vs_heads",
            "p_vs_heads",
            "delta_ndcg@10_vs_shallower",
            "p_vs_shallower",
        ],
    ),
    (
        "llm_layers_scifact_gpu",
        "The same depth curve with every SmolLM2 layer of both towers trained end to end, on an NVIDIA H200 "
        "(`bash scripts/device_llm_layers.sh`: SmolLM2 cut to its bottom 12 layers (`LAYERS=12`); bf16 autocast; two "
        "layer learning rates, "
        "`chosen` = best validation nDCG@10 of its depth; heads-only rows from the same run)",
        [
            "depth",
            "trainable_layers",
            "lr",
            "chosen",
            "ndcg@10",
            "r@100",
            "contrastive_ppl",
            "start_ndcg@10",
            "val_ndcg@10",
            "val_curve",
            "best_step",
            "steps_run",
            "train_seconds",
            "delta_ndcg@10_vs_heads",
            "p_vs_heads",
            "delta_ndcg@10_vs_shallower",
            "p_vs_shallower",
        ],
    ),
    (
        "llm_layers_scifact_twinbert_doc128",
        "TwinBERT under the depth grid's own rules (`python -m benchmarks.llm_layers --depths 4 --k 0 --doc-max 128 "
        "--twinbert-row --max-epochs 3 --tag twinbert_doc128`: MiniLM-L6, every layer, 128 document tokens; the "
        "grid's depth-4 heads-only row beside it)",
        [
            "method",
            "depth",
            "trainable_layers",
            "ndcg@10",
            "r@100",
            "start_ndcg@10",
            "val_ndcg@10",
            "val_curve",
            "best_step",
            "steps_run",
            "train_seconds",
            "delta_ndcg@10_vs_scaling_dual",
            "p_vs_scaling_dual",
        ],
    ),
    (
        "prompt_ablation_scifact",
        "Document-prompt ablations on SciFact (ScalingNote Table 5; `python -m benchmarks.prompt_ablation`)",
        None,
    ),
    (
        "fusion_synthetic",
        "Fusion towers on the synthetic note-search log (ScalingNote §3.5; `python -m benchmarks.fusion`)",
        None,
    ),
    (
        "annotation_scifact",
        "Annotation types at matched sizes on SciFact (scaling-laws paper §5; `python -m benchmarks.annotation`)",
        None,
    ),
    ("scaleout", "Scale-out engines: Ray encoding, Milvus Lite and a real Milvus server vs FAISS", None),
]
