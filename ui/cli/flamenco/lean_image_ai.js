// SPDX-License-Identifier: GPL-3.0-or-later
//
// Lean Image AI: a Flamenco 3 job type that runs one of the add-on's models over an image sequence.
// Copy this file into the `scripts/` folder next to the flamenco-manager executable and restart
// the Manager (see the add-on's README, "Flamenco").
//
// The frames are split into tasks of about `chunk_size` frames. Every task is one
// `blender --background <blendfile> --python farm_sequence.py -- COMMAND INPUT OUTPUT --frames F
// --shard I/N --skip-existing` call: the add-on itself picks task I's frames with the same rule as
// below (models/batch/frame_lists.py shard_slice), so a task label and the frames the task writes agree,
// and a requeued task redoes only what is missing.

const JOB_TYPE = {
    label: "Lean Image AI Sequence",
    settings: [
        {
            key: "command",
            type: "string",
            required: true,
            choices: ["remove-background", "depth", "geometry", "upscale"], // the registry's commands: python -m lean_image_ai flamenco-job-type
            default: "depth",
            description: "Which model runs on every frame",
        },
        {
            key: "input",
            type: "string",
            required: true,
            description: "Frames on shared storage: a pattern like /shots/plate_####.exr, a folder, or one frame",
        },
        {
            key: "output",
            type: "string",
            required: true,
            description: "A folder (ending in /) or a pattern like /out/depth_####.exr, on shared storage",
        },
        {
            key: "frames",
            type: "string",
            required: true,
            eval: "f'{C.scene.frame_start}-{C.scene.frame_end}'",
            description: "A-B or A-B:STEP (inclusive), e.g. 1001-1100 or 1001-1100:2",
        },
        { key: "chunk_size", type: "int32", default: 10, description: "About how many frames one task does" },
        {
            key: "script",
            type: "string",
            subtype: "file_path",
            required: true,
            description: "The add-on's examples/farm_sequence.py, where every Worker can read it",
        },
        { key: "model_id", type: "string", default: "", description: "Catalog model id (empty: the first installed)" },
        { key: "model_path", type: "string", default: "", description: "An ONNX file instead of a catalog model" },
        {
            key: "blendfile",
            type: "string",
            subtype: "file_path",
            required: true,
            eval: "C.blend_data.filepath",
            description: "The .blend Blender opens first (Flamenco's blender-render command needs one)",
            visible: "web",
        },
    ],
};

// ---- the split rule: the same as models/batch/frame_lists.py's parse_frames and shard_slice ----------------

// "A", "A-B" or "A-B:STEP" -> {first, last, step}, last reduced onto the step (A + k*STEP).
function parseFrames(text) {
    const match = /^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?(?::\s*(\d+)\s*)?$/.exec(String(text || ""));
    if (!match) {
        throw new Error(`Frames '${text}': write A-B or A-B:STEP, e.g. 1-48 or 1-48:2.`);
    }
    const first = parseInt(match[1], 10);
    const last = match[2] === undefined ? first : parseInt(match[2], 10);
    const step = match[3] === undefined ? 1 : parseInt(match[3], 10);
    if (last < first || step < 1) {
        throw new Error(`Frames '${text}': the end comes before the start, or the step is 0.`);
    }
    const count = Math.floor((last - first) / step) + 1;
    return { first: first, last: first + (count - 1) * step, step: step, count: count };
}

// How many tasks: enough for parts of at most chunkSize frames.
function shardCount(count, chunkSize) {
    const size = Math.max(1, Math.floor(chunkSize || 1));
    return Math.max(1, Math.ceil(count / size));
}

// Task `index` (1-based) of `total` gets positions [start, stop) of the `count` frames.
function shardSlice(count, index, total) {
    return {
        start: Math.floor(((index - 1) * count) / total),
        stop: Math.floor((index * count) / total),
    };
}

// The frame numbers of task `index` of `total` over a parsed range (empty when it has none).
function shardFrames(range, index, total) {
    const part = shardSlice(range.count, index, total);
    const numbers = [];
    for (let position = part.start; position < part.stop; position++) {
        numbers.push(range.first + position * range.step);
    }
    return numbers;
}

// ---- the job --------------------------------------------------------------------------------------

function compileJob(job) {
    const settings = job.settings;
    const range = parseFrames(settings.frames);
    const total = shardCount(range.count, settings.chunk_size);
    const frames = range.step === 1 ? `${range.first}-${range.last}` : `${range.first}-${range.last}:${range.step}`;
    const options = ["--skip-existing"];
    if (settings.model_id) {
        options.push("--model-id", settings.model_id);
    }
    if (settings.model_path) {
        options.push("--model-path", settings.model_path);
    }
    print(`Lean Image AI: ${range.count} frame(s) of ${settings.input} in ${total} task(s)`);

    for (let index = 1; index <= total; index++) {
        const numbers = shardFrames(range, index, total);
        const label = `${numbers[0]}-${numbers[numbers.length - 1]}`;
        const task = author.Task(`${settings.command}-${label}`, "blender");
        task.addCommand(
            author.Command("blender-render", {
                exe: "{blender}",
                exeArgs: "{blenderArgs}",
                argsBefore: ["--background", "--python-exit-code", "1"],
                blendfile: settings.blendfile,
                args: [
                    "--python",
                    settings.script,
                    "--",
                    settings.command,
                    settings.input,
                    settings.output,
                    "--frames",
                    frames,
                    "--shard",
                    `${index}/${total}`,
                ].concat(options),
            }),
        );
        job.addTask(task);
    }
}
