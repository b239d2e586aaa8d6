// A small Mongoose app written for MongoDB's native time-series
// collections, run unchanged through tsproxy (TestTimeseriesMongoose): a
// schema with the timeseries option and autoCreate, inserts, reads,
// aggregates, a delete, a findOneAndUpdate and an updateMany, the
// collection's listing, and MongoDB's error for
// a measurement without a date. It prints one JSON line of what it saw.
//
//   TSPROXY_URI=mongodb://127.0.0.1:27017/weatherdb node mongoose_weather.js
'use strict';
const mongoose = require('mongoose');

const readingSchema = new mongoose.Schema(
  {
    timestamp: { type: Date, required: true },
    metadata: { sensorId: Number, type: { type: String } },
    temp: Number,
  },
  {
    timeseries: { timeField: 'timestamp', metaField: 'metadata', granularity: 'hours' },
    expireAfterSeconds: 10 * 365 * 86400, // 10 years: MongoDB refuses more than the seconds since 1970
    autoCreate: true,
  },
);
const Reading = mongoose.model('Reading', readingSchema);

async function main() {
  await mongoose.connect(process.env.TSPROXY_URI);
  await Reading.init(); // autoCreate: createCollection with the timeseries option

  const base = Date.UTC(2026, 0, 1);
  const docs = [];
  for (let i = 0; i < 600; i++) {
    docs.push({ timestamp: new Date(base + i * 60000), metadata: { sensorId: i % 6, type: 'temperature' }, temp: 10 + (i % 30) / 2 });
  }
  await Reading.insertMany(docs);
  await Reading.create({ timestamp: new Date(base + 600 * 60000), metadata: { sensorId: 5, type: 'temperature' }, temp: 99 });

  const out = {};
  out.count = await Reading.countDocuments();
  out.sensor5 = await Reading.countDocuments({ 'metadata.sensorId': 5 });
  const latest = await Reading.findOne({ 'metadata.sensorId': 5 }).sort({ timestamp: -1 }).lean();
  out.latest = { temp: latest.temp, timestamp: latest.timestamp.toISOString(), sensorId: latest.metadata.sensorId };
  const firstHour = await Reading.find({ timestamp: { $gte: new Date(base), $lt: new Date(base + 3600000) } })
    .sort({ timestamp: 1 }).select({ _id: 0, temp: 1 }).lean();
  out.firstHour = firstHour.length;
  out.firstTemps = firstHour.slice(0, 3).map((d) => d.temp);
  out.sensors = (await Reading.distinct('metadata.sensorId')).sort((a, b) => a - b);
  const lastThree = await Reading.aggregate([
    { $match: { 'metadata.sensorId': 3, timestamp: { $lt: new Date(base + 3600000) } } },
    { $sort: { timestamp: -1 } },
    { $limit: 3 },
    { $project: { _id: 0, temp: 1 } },
  ]);
  out.lastThree = lastThree.map((d) => d.temp);
  const [inRange] = await Reading.aggregate([
    { $match: { timestamp: { $gte: new Date(base + 3600000), $lt: new Date(base + 7200000) } } },
    { $count: 'n' },
  ]);
  out.inRange = inRange.n;
  const del = await Reading.deleteMany({ 'metadata.sensorId': 0 });
  out.deleted = del.deletedCount;
  out.after = await Reading.countDocuments();
  const fixed = await Reading.findOneAndUpdate({ 'metadata.sensorId': 5, temp: 99 }, { $set: { temp: 98 } }, { returnDocument: 'after' }).lean();
  out.fixed = fixed.temp;
  const warmer = await Reading.updateMany({ 'metadata.sensorId': 1 }, { $inc: { temp: 1 } });
  out.warmer = warmer.modifiedCount;

  const [info] = await mongoose.connection.db.listCollections({ name: 'readings' }).toArray();
  out.type = info.type;
  out.timeseries = info.options.timeseries;
  out.expireAfterSeconds = Number(info.options.expireAfterSeconds);

  try {
    await Reading.collection.insertOne({ metadata: { sensorId: 1 }, temp: 1 }); // no timestamp, past Mongoose's validation
    out.noDate = 'accepted';
  } catch (e) {
    out.noDate = `${e.code} ${e.message}`;
  }
  await Reading.createCollection(); // as a second start of the app does: the same create again
  console.log(JSON.stringify(out));
  await mongoose.disconnect();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
