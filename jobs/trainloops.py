"""The two ways the train job trains: Keras ``fit`` and the custom loop of TensorFlow's "Use TPUs" guide.

Both report through the same ``TrainingReporter`` and validate with the same
``Evaluator``; ``distribute`` and ``input_options`` give them their
per-replica datasets. ``compile_for_fit`` and ``fit_and_report`` are Keras
only: the train job on JAX (``jobs.on_jax.train``) fits through them too.
"""

from __future__ import annotations

import math

from jobs import datasets as data
from jobs.trainplan import distribute, make_optimizer
from jobs.trainreport import early_stopping_text, make_evaluator, reporting_callback


def train_with_fit(ctx, tf, keras, strategy, model, recipe, params, plan, splits, reporter) -> bool:
    """Keras ``model.fit`` on the distributed training set; validation by the shared Evaluator."""
    with strategy.scope():
        compile_for_fit(keras, model, recipe, params, plan)
    if plan.steps_per_execution > 1 and ctx.runtime.kind != "TPU":
        model.train_function = multi_step_train_function(tf, model, strategy, plan.steps_per_execution)
    if ctx.runtime.kind == "CPU":
        train = distribute(
            tf,
            strategy,
            ctx.runtime.kind,
            lambda batch_size, input_context: data.training_pipeline(
                splits.train, batch_size, params["seed"], input_context=input_context
            ),
            plan.global_batch,
        )
    else:
        # Keras distributes the global batches itself, as on any TPU or GPU.
        train = data.training_pipeline(splits.train, plan.global_batch, params["seed"])
    evaluate = make_evaluator(ctx, tf, keras, strategy, model, recipe, plan, splits, reporter.stage)
    return fit_and_report(ctx, keras, model, params, plan, train, evaluate, reporter)


def compile_for_fit(keras, model, recipe, params, plan) -> None:
    """The loss, metric, optimizer and steps_per_execution ``fit`` trains with, on any Keras backend."""
    model.compile(
        optimizer=make_optimizer(params["optimizer"], params["learning_rate"], params["precision"]),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=recipe.from_logits),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=plan.steps_per_execution,
    )


def fit_and_report(ctx, keras, model, params, plan, train, evaluate, reporter) -> bool:
    """``model.fit`` on ``train`` with the reporting callback, ``evaluate`` at every epoch's end, early stopping
    on val_loss, and the test split at the end; whether it stopped early. The same on TensorFlow and JAX."""
    callbacks = [reporting_callback(keras, ctx, reporter, evaluate)]
    early_stopping = None
    if params["early_stopping_patience"]:
        early_stopping = keras.callbacks.EarlyStopping(
            monitor="val_loss",
            patience=params["early_stopping_patience"],
            mode="min",
            restore_best_weights=True,
        )
        callbacks.append(early_stopping)
    model.fit(
        train, epochs=plan.epochs, steps_per_epoch=plan.steps_per_epoch, callbacks=callbacks, verbose=0, shuffle=False
    )
    stopped_early = False
    if early_stopping is not None and early_stopping.stopped_epoch > 0 and not ctx.cancelled():
        stopped_early = True
        ctx.log(
            early_stopping_text(
                early_stopping.stopped_epoch + 1,
                params["early_stopping_patience"],
                early_stopping.best,
                early_stopping.best_weights is not None,
            )
        )
    if not ctx.cancelled():
        results = evaluate("test")
        if results is not None:
            reporter.report_test(results)
    return stopped_early


def multi_step_train_function(tf, model, strategy, steps: int):
    """A multi-step train function for ``fit`` off a TPU.

    Keras 3's own one (an Optional-guarded tf.cond around each step) fails
    under MirroredStrategy with "You must feed a value for placeholder tensor"
    (keras-team/keras#19246). This is the tf-keras loop it replaced: ``steps``
    ``strategy.run`` calls in a ``tf.range`` loop. The training dataset is
    endless and epochs are whole executions, so no step needs the guard.
    """

    def mean_over_replicas(value):
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)

    @tf.function(reduce_retracing=True)
    def train_function(iterator):
        for _ in tf.range(steps - 1):
            strategy.run(model.train_step, args=(next(iterator),))
        outputs = strategy.run(model.train_step, args=(next(iterator),))
        return tf.nest.map_structure(mean_over_replicas, outputs)

    return train_function


def train_with_custom_loop(ctx, tf, keras, strategy, model, recipe, params, plan, splits, reporter) -> bool:
    """The \"Use TPUs\" guide's custom training loop, with validation, early stopping and cancel."""
    precision = params["precision"]
    with strategy.scope():
        optimizer = make_optimizer(params["optimizer"], params["learning_rate"], precision)
        loss_function = keras.losses.SparseCategoricalCrossentropy(from_logits=recipe.from_logits, reduction="none")
        train_loss = keras.metrics.Mean(name="loss")
        train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        # Slot variables made inside the first tf.function call would wrap
        # it in an initialisation tf.cond, which MirroredStrategy's
        # cross-replica merge cannot run in.
        optimizer.build(model.trainable_variables)
    global_batch = plan.global_batch
    seed = params["seed"]

    def train_dataset(batch_size, input_context):
        return data.training_pipeline(splits.train, batch_size, seed, input_context=input_context)

    train_distributed = distribute(tf, strategy, ctx.runtime.kind, train_dataset, global_batch)
    scale_loss = precision == "mixed_float16"

    def step_fn(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            outputs = model(images, training=True)
            per_example = loss_function(labels, outputs)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss) if scale_loss else loss
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        train_loss.update_state(loss * strategy.num_replicas_in_sync)
        train_accuracy.update_state(labels, outputs)

    @tf.function
    def train_steps(iterator, steps):
        for _ in tf.range(steps):
            strategy.run(step_fn, args=(next(iterator),))

    evaluate = make_evaluator(ctx, tf, keras, strategy, model, recipe, plan, splits, reporter.stage)
    patience = params["early_stopping_patience"]
    best_loss, best_weights, waited = math.inf, None, 0
    stopped_early = False
    iterator = iter(train_distributed)
    for epoch in range(1, plan.epochs + 1):
        train_loss.reset_state()
        train_accuracy.reset_state()
        reporter.begin_epoch(epoch)
        done = 0
        while done < plan.steps_per_epoch and not ctx.cancelled():
            steps = min(plan.steps_per_execution, plan.steps_per_epoch - done)
            reporter.before_execution(steps)
            train_steps(iterator, tf.constant(steps))
            done += steps
            reporter.after_execution(done, float(train_loss.result()), float(train_accuracy.result()))
        if ctx.cancelled():
            return False
        reporter.end_training_part()
        val = evaluate("val")
        if val is None:
            return False
        reporter.end_epoch({"loss": float(train_loss.result()), "accuracy": float(train_accuracy.result())}, val)
        if patience:
            # Keras EarlyStopping's rule: improvement is a lower val_loss (a
            # NaN never improves), and the first epoch never stops a run.
            if val["loss"] < best_loss:
                best_loss, best_weights, waited = val["loss"], model.get_weights(), 0
            else:
                waited += 1
                if waited >= patience and epoch > 1:
                    stopped_early = True
                    if best_weights is not None:
                        model.set_weights(best_weights)
                    ctx.log(early_stopping_text(epoch, patience, best_loss, best_weights is not None))
                    break
    results = evaluate("test")
    if results is not None:
        reporter.report_test(results)
    return stopped_early
