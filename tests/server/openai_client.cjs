// Drives skippy-server with the official openai npm package (v4): a chat completion, a completion
// and a streamed chat. Usage: node openai_client.cjs NODE_MODULES_DIR BASE_URL API_KEY
// Exits non-zero (with a message) on any failure.
const path = require('path');
const [, , modules, baseURL, apiKey] = process.argv;
const OpenAI = require(path.join(modules, 'openai'));

function check(cond, what) {
  if (!cond) {
    console.error('FAIL: ' + what);
    process.exit(1);
  }
}

// Long enough to be cached in either flash-attention setting (64+ tokens when it is on).
const system = 'You are a helpful assistant. '.repeat(16);

(async () => {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

  const models = await client.models.list();
  check(models.data.length === 1, 'one model listed');
  const model = models.data[0].id;

  const chat = await client.chat.completions.create({
    model,
    messages: [
      { role: 'system', content: system },
      { role: 'user', content: 'Say hello.' },
    ],
    max_tokens: 6,
    temperature: 0,
  });
  check(chat.object === 'chat.completion', 'chat object');
  check(typeof chat.choices[0].message.content === 'string', 'chat content is a string');
  check(chat.usage && chat.usage.completion_tokens > 0, 'chat usage');

  const again = await client.chat.completions.create({
    model,
    messages: [
      { role: 'system', content: system },
      { role: 'user', content: 'Say hello.' },
    ],
    max_tokens: 6,
    temperature: 0,
  });
  check(again.choices[0].message.content === chat.choices[0].message.content, 'greedy repeat is identical');
  check(again.usage.prompt_tokens_details.cached_tokens > 0, 'repeat hits the cache');

  const completion = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  check(completion.object === 'text_completion', 'completion object');
  check(typeof completion.choices[0].text === 'string', 'completion text');

  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: 'user', content: 'Stream a few tokens.' }],
    max_tokens: 5,
    stream: true,
  });
  let chunks = 0;
  let finish = null;
  for await (const chunk of stream) {
    chunks += 1;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  check(chunks >= 2, 'streamed chunks');
  check(finish === 'length' || finish === 'stop', 'stream finish reason');

  let unauthorized = false;
  try {
    await new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).models.list();
  } catch (e) {
    unauthorized = e.status === 401;
  }
  check(unauthorized, 'a wrong key is a 401');
  console.log('openai client: OK');
})().catch((e) => {
  console.error('FAIL: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
