"""The reading guide's demo tables: written from summary.csv's and spectrum.csv's rows as the files
hold them, the seen case only, states without a step or a preconditioner left out."""

from tiny_llm.results.guide_tables import GUIDE_TABLES, geometry_table, states_table, steps_table


def _row(epoch, **values):
    row = {
        "file": f"epoch-{epoch:03d}.safetensors",
        "case": "seen",
        "step": str(8 * epoch),
        "tokens": str(8192 * epoch),
    }
    names = ("loss", "normalized_alignment", "random_curvature", "random_curvature_se", "grad_curvature", "b_simple")
    names += ("b_noise", "step_grad_dot", "step_sharpness", "optimal_step", "predicted_loss_change")
    names += ("actual_loss_change", "precond_b_simple", "precond_b_noise", "precond_gradient_step")
    return {**dict.fromkeys(names, ""), **row, **values}


SUMMARY = [
    _row(1, loss="3.4771", b_simple="0.36", b_noise="0.22", step_grad_dot="-0.87", step_sharpness="0.057",
         optimal_step="0.63", predicted_loss_change="-0.185", actual_loss_change="-0.307", random_curvature="0.00183",
         random_curvature_se="0.00008", precond_b_simple="3.55", precond_b_noise="10.4",
         precond_gradient_step="0.0138"),
    _row(0, loss="5.541", step_grad_dot="-1.81", random_curvature="-0.00047", random_curvature_se="0.00049"),
    _row(4, loss="3.143", b_simple="30.6", b_noise="14.2", random_curvature="0.00145", random_curvature_se="0.00006",
         precond_b_simple="20.4", precond_b_noise="97", precond_gradient_step="0.013"),
    {**_row(4, loss="9.9"), "case": "unseen"},
    {**_row(4, loss="3.143"), "file": "final.pt"},  # the last epoch's alias: one row
]  # fmt: skip
SPECTRUM = [{"file": "epoch-001.safetensors", "case": "seen", "lr": "0.0097", "stability_threshold": "3898.2",
             "precond_la_eigenvalue_1": "697.1"}]  # fmt: skip
NEXT = [{**SPECTRUM[0], "precond_la_eigenvalue_1": "1203.4"}]


def test_the_states_table_reads_the_seen_rows_in_step_order():
    text = states_table(SUMMARY)
    lines = text.splitlines()[2:]
    assert [line.split(" | ")[0] for line in lines] == [
        "| initialisation (0 tokens)", "| epoch 1 (8,192 tokens)", "| final (32,768 tokens)"
    ]  # fmt: skip
    assert "| 5.541 | null | −0.000470 ± 0.000490 |" in lines[0] and "| 30.6 | 14.2 |" in lines[2]


def test_the_steps_table_leaves_out_the_last_state():
    lines = steps_table(SUMMARY).splitlines()[2:]
    assert lines == [
        "| initialisation | −1.81 | null | null | null | null |",
        "| epoch 1 | −0.87 | 0.057 | 0.63 | −0.185 | −0.307 |",
    ]


def test_the_geometry_table_puts_both_preconditioners_beside_the_threshold():
    lines = geometry_table(SUMMARY, SPECTRUM, NEXT).splitlines()
    assert "P applied | λ_max(PH), P of the next step |" in lines[0]
    assert lines[2] == "| epoch 1 | 0.0097 | 0.36 | 3.55 | 0.22 | 10.4 | 0.0138 | 697 | 1,203 | 3,898 |"
    assert lines[3].startswith("| epoch 4 | null | 30.6 | 20.4 | 14.2 | 97 | 0.013 | null | null | null |")
    assert sorted(GUIDE_TABLES) == ["demo-geometry", "demo-states", "demo-steps"]
