"""The Caffe2 MNIST tutorial flow (LeNet with brew, hand-written SGD with brew.iter and
LearningRate, Print/Summarize bookkeeping to files, test and deploy models sharing params)."""
import numpy as np
from caffe2.python import brew, model_helper, workspace


def AddLeNetModel(model, data):
    conv1 = brew.conv(model, data, "conv1", dim_in=1, dim_out=4, kernel=3)
    pool1 = brew.max_pool(model, conv1, "pool1", kernel=2, stride=2)
    conv2 = brew.conv(model, pool1, "conv2", dim_in=4, dim_out=8, kernel=2)
    pool2 = brew.max_pool(model, conv2, "pool2", kernel=2, stride=2)
    fc3 = brew.fc(model, pool2, "fc3", dim_in=8 * 1 * 1, dim_out=16)
    relu3 = brew.relu(model, fc3, "relu3")
    pred = brew.fc(model, relu3, "pred", 16, 10)
    return brew.softmax(model, pred, "softmax")


def AddAccuracy(model, softmax, label):
    return brew.accuracy(model, [softmax, label], "accuracy")


def AddTrainingOperators(model, softmax, label):
    xent = model.LabelCrossEntropy([softmax, label], "xent")
    loss = model.AveragedLoss(xent, "loss")
    AddAccuracy(model, softmax, label)
    model.AddGradientOperators([loss])
    ITER = brew.iter(model, "iter")
    LR = model.LearningRate(ITER, "LR", base_lr=-0.1, policy="step", stepsize=1, gamma=0.999)
    ONE = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.params:
        param_grad = model.param_to_grad[param]
        model.WeightedSum([param, ONE, param_grad, LR], param)


def AddBookkeepingOperators(model):
    model.Print("accuracy", [], to_file=1)
    model.Print("loss", [], to_file=1)
    for param in model.params:
        model.Summarize(param, [], to_file=1)
        model.Summarize(model.param_to_grad[param], [], to_file=1)


def make_data(n=32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    x[np.arange(n), 0, y % 8, y // 8 * 2] += 3.0  # make the classes learnable
    return x, y


def main(root_folder, iters=60, seed=100):
    workspace.ResetWorkspace(root_folder)
    arg_scope = {"order": "NCHW"}
    train_model = model_helper.ModelHelper(name="mnist_train", arg_scope=arg_scope)
    softmax = AddLeNetModel(train_model, "data")
    AddTrainingOperators(train_model, softmax, "label")
    AddBookkeepingOperators(train_model)
    test_model = model_helper.ModelHelper(name="mnist_test", arg_scope=arg_scope,
                                          init_params=False)
    AddAccuracy(test_model, AddLeNetModel(test_model, "data"), "label")
    deploy_model = model_helper.ModelHelper(name="mnist_deploy", arg_scope=arg_scope,
                                            init_params=False)
    AddLeNetModel(deploy_model, "data")

    x, y = make_data()
    workspace.FeedBlob("data", x)
    workspace.FeedBlob("label", y)
    train_model.param_init_net.set_rand_seed(seed=seed)
    workspace.RunNetOnce(train_model.param_init_net)
    workspace.CreateNet(train_model.net, overwrite=True)
    loss, accuracy = [], []
    for _ in range(iters):
        workspace.RunNet(train_model.net)
        loss.append(float(workspace.FetchBlob("loss")))
        accuracy.append(float(workspace.FetchBlob("accuracy")))

    workspace.RunNetOnce(test_model.param_init_net)
    workspace.CreateNet(test_model.net, overwrite=True)
    workspace.RunNet(test_model.net.Proto().name)
    test_accuracy = float(workspace.FetchBlob("accuracy"))

    workspace.FeedBlob("data", x[:5])
    workspace.RunNetOnce(deploy_model.net)
    deployed = workspace.FetchBlob("softmax")
    return {"loss": loss, "accuracy": accuracy, "test_accuracy": test_accuracy,
            "deployed": deployed, "labels": y, "iter": int(workspace.FetchBlob("iter")[0])}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        result = main(folder)
    print(result["loss"][0], result["loss"][-1], result["test_accuracy"])
