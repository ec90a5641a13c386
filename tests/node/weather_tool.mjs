// The parameters of the get_weather tool the tool-calling tests offer: a city of two and a
// number of days in [0, 7], both required and nothing else, so that a forced call has few
// valid spellings and each can be checked.
export const WEATHER = {
  type: 'object',
  properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] }, days: { type: 'integer', minimum: 0, maximum: 7 } },
  required: ['city', 'days'],
  additionalProperties: false,
};
