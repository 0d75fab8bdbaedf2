// A group member's device run by Baileys (https://github.com/WhiskeySockets/Baileys),
// a WhatsApp Web client nobody here wrote, with its own Signal implementation:
// the tests in tests/baileys/ check that what Herald sends through the fake
// WhatsApp server decrypts on it.
//
//   node member.mjs WS_URL AUTH_DIR
//
// Speaks JSON lines on stdout:
//   {"event":"qr","qr":…}           a pairing QR for the fake's phone to scan
//   {"event":"open","me":…}         logged in, pre-keys uploaded
//   {"event":"message",…}           a message it decrypted (see `report`)
//   {"event":"undecryptable",…}     one it could not
//   {"event":"closed","code":…}     the connection ended (it reconnects)
//   {"event":"sent","id":…}         a message it was told to send went out
// and reads every message it gets (read receipts), as a member would.
//   {"event":"poll","group":…,"poll_id":…,"tally":[{"name","voters"}]}
//                                   a poll's count after each vote it heard
//                                   or cast, by Baileys' own code (below)
//   {"event":"vote_undecryptable",…} a vote it could not open
// Reads JSON lines on stdin: {"send":{"group":JID,"text":…}} sends a text
// to the group (Baileys on the sending side); {"standing":true} asks the
// server what WhatsApp Web asks of an account, with Baileys' own calls
// (its reach-out time-lock and new-chat quota), and prints
//   {"event":"standing","timelock":…,"quota":…}   as Baileys decoded them
// {"vote":{"group":…,"poll_id":…,"options":[…]}} votes on a poll it read
// (an empty list withdraws), as a member's device does, and prints
//   {"event":"voted","id":…,"group":…,"poll_id":…}
//
// Polls: Baileys opens a vote (decryptPollVote), keeps each voter's latest
// (updateMessageWithPollUpdate) and counts them (getAggregateVotesInPollMessage),
// all its own code. It has no call to cast a vote, so `vote` seals one here
// the way decryptPollVote opens it and Baileys relays it to the group.
import crypto from 'node:crypto'
import readline from 'node:readline'
import makeWASocket, {
  useMultiFileAuthState,
  DisconnectReason,
  downloadContentFromMessage,
  getMediaKeys,
  toBuffer,
  proto,
  jidNormalizedUser,
  decryptPollVote,
  updateMessageWithPollUpdate,
  getAggregateVotesInPollMessage,
  hmacSign,
  aesEncryptGCM,
} from 'baileys'

const [url, dir] = process.argv.slice(2)
if (!url || !dir) {
  console.error('usage: node member.mjs WS_URL AUTH_DIR')
  process.exit(2)
}

const say = (o) => process.stdout.write(JSON.stringify(o) + '\n')
// Baileys leaves some failures as unhandled rejections (its retry path);
// report them rather than die, so the test sees what went wrong.
process.on('unhandledRejection', (e) => say({ event: 'error', error: String(e && e.stack || e) }))

const silent = {
  level: 'silent',
  child() { return silent },
  trace() {}, debug() {}, info() {}, warn() {}, error() {}, fatal() {},
}
const sha256 = (b) => crypto.createHash('sha256').update(b).digest('hex')
const hex = (b) => Buffer.from(b || []).toString('hex')

// A picture: downloaded and decrypted by Baileys (the test runs it with
// NODE_TLS_REJECT_UNAUTHORIZED=0: the fake's media host has a self-signed
// certificate); the file's hashes and MAC, which Baileys does not check, are
// checked here against the message.
async function picture(m) {
  const plain = await toBuffer(await downloadContentFromMessage(m, 'image'))
  const file = Buffer.from(await (await fetch(m.url)).arrayBuffer())
  const keys = await getMediaKeys(m.mediaKey, 'image')
  const body = file.subarray(0, file.length - 10)
  const mac = crypto.createHmac('sha256', keys.macKey)
    .update(Buffer.concat([keys.iv, body])).digest().subarray(0, 10)
  return {
    bytes: plain.length,
    sha256: sha256(plain),
    sha256_matches: hex(m.fileSha256) === sha256(plain),
    enc_sha256_matches: hex(m.fileEncSha256) === sha256(file),
    mac_matches: mac.equals(file.subarray(file.length - 10)),
    length_matches: Number(m.fileLength) === plain.length,
    mimetype: m.mimetype,
  }
}

// The polls it read, by message id: { group, creator, message, pollUpdates },
// the shape Baileys' poll functions take.
const polls = new Map()

const pollOf = (m) => m.pollCreationMessage || m.pollCreationMessageV2 || m.pollCreationMessageV3

function tally(sock, id) {
  const p = polls.get(id)
  const me = jidNormalizedUser(sock.user && sock.user.id)
  say({ event: 'poll', group: p.group, poll_id: id, tally: getAggregateVotesInPollMessage(p, me) })
}

// A member's vote on a poll it read: opened and counted by Baileys.
function heardVote(sock, msg, update) {
  const k = msg.key
  const created = update.pollCreationMessageKey || {}
  const p = polls.get(created.id)
  const base = { group: k.remoteJid, id: k.id, participant: k.participant, poll_id: created.id }
  if (!p) {
    say({ event: 'vote_undecryptable', ...base, why: 'a poll it did not read' })
    return
  }
  try {
    const vote = decryptPollVote(update.vote, {
      pollEncKey: p.message.messageContextInfo.messageSecret,
      pollCreatorJid: p.creator,
      pollMsgId: created.id,
      voterJid: jidNormalizedUser(k.participant),
    })
    updateMessageWithPollUpdate(p, {
      pollUpdateMessageKey: k,
      vote,
      senderTimestampMs: Number(update.senderTimestampMs),
    })
    tally(sock, created.id)
  } catch (e) {
    say({ event: 'vote_undecryptable', ...base, why: String(e) })
  }
}

// Seals a vote as decryptPollVote opens it (the key from the poll's secret,
// its id and both JIDs; AES-GCM), sends it to the group and counts it.
async function castVote(sock, { group, poll_id, options }) {
  const p = polls.get(poll_id)
  if (!p) throw new Error(`no poll ${poll_id} read`)
  const me = jidNormalizedUser(sock.user.id)
  const selectedOptions = options.map((o) => crypto.createHash('sha256').update(o).digest())
  const plain = proto.Message.PollVoteMessage.encode({ selectedOptions }).finish()
  const sign = Buffer.concat([
    Buffer.from(poll_id), Buffer.from(p.creator), Buffer.from(me),
    Buffer.from('Poll Vote'), Buffer.from([1]),
  ])
  const key = hmacSign(sign, hmacSign(p.message.messageContextInfo.messageSecret, Buffer.alloc(32)))
  const encIv = crypto.randomBytes(12)
  const encPayload = aesEncryptGCM(plain, key, encIv, Buffer.from(`${poll_id}\u0000${me}`))
  const senderTimestampMs = Date.now()
  const pollCreationMessageKey = { remoteJid: group, fromMe: false, id: poll_id, participant: p.creator }
  const id = await sock.relayMessage(group, {
    pollUpdateMessage: { pollCreationMessageKey, vote: { encPayload, encIv }, senderTimestampMs },
  }, {})
  say({ event: 'voted', id, group, poll_id })
  updateMessageWithPollUpdate(p, {
    pollUpdateMessageKey: { remoteJid: group, fromMe: true, id },
    vote: { selectedOptions },
    senderTimestampMs,
  })
  tally(sock, poll_id)
}

async function report(sock, msg) {
  const k = msg.key
  const base = { group: k.remoteJid, id: k.id, participant: k.participant, from_me: !!k.fromMe }
  if (msg.messageStubType === 2 /* CIPHERTEXT: could not decrypt */ || !msg.message) {
    say({ event: 'undecryptable', ...base, why: msg.messageStubParameters || [] })
    return
  }
  const m = msg.message
  if (m.pollUpdateMessage) {
    heardVote(sock, msg, m.pollUpdateMessage)
    return
  }
  const out = { event: 'message', ...base }
  const poll = pollOf(m)
  if (poll) {
    polls.set(k.id, { group: k.remoteJid, creator: jidNormalizedUser(k.participant), message: m, pollUpdates: [] })
    out.poll = {
      question: poll.name,
      options: (poll.options || []).map((o) => o.optionName),
      selectable: poll.selectableOptionsCount || 0,
      secret: !!(m.messageContextInfo && m.messageContextInfo.messageSecret && m.messageContextInfo.messageSecret.length === 32),
    }
  }
  if (m.conversation != null) out.text = m.conversation
  if (m.extendedTextMessage) out.text = m.extendedTextMessage.text
  if (m.imageMessage) {
    out.caption = m.imageMessage.caption || null
    try {
      out.image = await picture(m.imageMessage)
    } catch (e) {
      out.image = { error: String(e) }
    }
  }
  const p = m.protocolMessage
  if (p) {
    // 0 = REVOKE, 14 = MESSAGE_EDIT.
    out.protocol = p.type === 0 ? 'revoke' : p.type === 14 ? 'edit' : String(p.type)
    out.refers_to = p.key && p.key.id
    const e = p.editedMessage
    if (e) out.text = e.conversation ?? (e.extendedTextMessage && e.extendedTextMessage.text) ?? (e.imageMessage && e.imageMessage.caption)
  }
  if (m.senderKeyDistributionMessage && Object.keys(m).length === 1) return
  say(out)
  // A member reads what arrives: Herald counts the read receipts.
  if (!p) await sock.readMessages([k])
}

async function main() {
  const { state, saveCreds } = await useMultiFileAuthState(dir)
  let current = null
  const sock = {
    sendMessage: (...a) => current.sendMessage(...a),
    fetchAccountReachoutTimelock: () => current.fetchAccountReachoutTimelock(),
    fetchNewChatMessageCap: () => current.fetchNewChatMessageCap(),
    relayMessage: (...a) => current.relayMessage(...a),
    get user() { return current.user },
  }
  function start() {
    // Baileys holds back new messages until it has an app-state key, which
    // only a real phone shares; nothing here reads app state.
    if (state.creds.me) state.creds.myAppStateKeyId ||= 'AAAAAAAA'
    const sock = makeWASocket({
      waWebSocketUrl: url,
      auth: state,
      logger: silent,
      markOnlineOnConnect: false,
      fireInitQueries: false,
      syncFullHistory: false,
      shouldSyncHistoryMessage: () => false,
    })
    current = sock
    sock.ev.on('creds.update', saveCreds)
    sock.ev.on('connection.update', (u) => {
      if (u.qr) say({ event: 'qr', qr: u.qr })
      if (u.connection === 'open') say({ event: 'open', me: sock.user && sock.user.id })
      if (u.connection === 'close') {
        const code = u.lastDisconnect && u.lastDisconnect.error && u.lastDisconnect.error.output
          ? u.lastDisconnect.error.output.statusCode : null
        say({ event: 'closed', code })
        if (code !== DisconnectReason.loggedOut) setTimeout(start, code === DisconnectReason.restartRequired ? 0 : 500)
      }
    })
    sock.ev.on('messages.upsert', async ({ messages }) => {
      for (const msg of messages) {
        try {
          await report(sock, msg)
        } catch (e) {
          say({ event: 'error', id: msg.key && msg.key.id, error: String(e && e.stack || e) })
        }
      }
    })
  }
  start()
  const lines = readline.createInterface({ input: process.stdin })
  lines.on('line', async (line) => {
    try {
      const { send, standing, vote } = JSON.parse(line)
      if (vote) {
        await castVote(sock, vote)
        return
      }
      if (standing) {
        const lock = await sock.fetchAccountReachoutTimelock()
        const quota = await sock.fetchNewChatMessageCap()
        say({
          event: 'standing',
          timelock: {
            active: lock.isActive,
            until: lock.timeEnforcementEnds ? lock.timeEnforcementEnds.toISOString() : null,
            kind: lock.enforcementType,
          },
          quota,
        })
        return
      }
      const sent = await sock.sendMessage(send.group, { text: send.text })
      say({ event: 'sent', id: sent.key.id, group: send.group })
    } catch (e) {
      say({ event: 'error', error: String(e && e.stack || e) })
    }
  })
}

main().catch((e) => {
  say({ event: 'error', error: String(e && e.stack || e) })
  process.exit(1)
})
